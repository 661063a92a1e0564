"""data.streams: which (position, encoded example) pairs each process gets, in both modes."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from vmoe_sparse_ot import data
from vmoe_sparse_ot.data import sampling
from vmoe_sparse_ot.data import streams

# sklearn_digits 'test[:10]' read by p of P=2 processes, b=3 examples a batch: global
# batch t is positions [6t, 6t+6), process p holds rows [3p, 3p+3) of it.
SPLIT, N, B, P = 'test[:10]', 10, 3, 2
COMMON = dict(batch_size=B, process_count=P, shuffle_seed=5, label_key='label')


@pytest.fixture(scope='module')
def builder():
  return data.get_builder('sklearn_digits')


def _pairs(ds, count=None):
  """[(position, label, encoded image)] of a stream, its first `count` if given."""
  ds = ds if count is None else ds.take(count)
  return [(int(i), int(ex['label']), bytes(ex['image'])) for i, ex in ds.as_numpy_iterator()]


def _records(builder):
  """(label, encoded image) of each record of SPLIT, in order."""
  ds = builder.as_dataset(SPLIT, shuffle_files=False,
                          decoders={'image': tfds.decode.SkipDecoding()})
  return [(int(ex['label']), bytes(ex['image'])) for ex in ds.as_numpy_iterator()]


def test_example_gives_label_and_keeps_another_label_feature_under_its_name():
  features = {'image': b'png', 'label': 1, 'real_label': [0, 2], 'id': 'x'}
  assert streams.example(features, 'label') == {'image': b'png', 'label': 1}
  assert streams.example(features, 'real_label') == {
      'image': b'png', 'label': [0, 2], 'real_label': [0, 2]}


def test_evaluation_is_one_pass_in_order_split_between_processes(builder):
  records = _records(builder)
  mine = {0: [0, 1, 2, 6, 7, 8], 1: [3, 4, 5, 9]}
  for p, positions in mine.items():
    expected = [(i, *records[i]) for i in positions]
    index = streams.index_examples(builder, SPLIT, training=False, process_index=p,
                                   start_step=0, **COMMON)
    stream = streams.stream_examples(builder, SPLIT, training=False, shuffle_buffer=16,
                                     cache=False, process_index=p, start_step=0, **COMMON)
    assert _pairs(index) == expected
    assert _pairs(stream) == expected


def test_index_training_reads_the_seeded_records_from_the_start_step(builder):
  records = _records(builder)
  # Step 2, process 1: positions 2*6 + 3 + {0, 1, 2}, then 3*6 + 3 + ... .
  got = _pairs(streams.index_examples(builder, SPLIT, training=True, process_index=1,
                                      start_step=2, **COMMON), count=6)
  positions = [15, 16, 17, 21, 22, 23]
  indices = sampling.record_indices(np.array(positions), N, 5)
  assert got == [(i, *records[k]) for i, k in zip(positions, indices)]


def test_stream_training_keeps_this_process_rows_after_skipping_the_steps(builder):
  got = _pairs(streams.stream_examples(builder, SPLIT, training=True, shuffle_buffer=16,
                                       cache=True, process_index=1, start_step=2, **COMMON),
               count=6)
  assert [i for i, _, _ in got] == [15, 16, 17, 21, 22, 23]
  # Positions 12 .. 23 of an endless shuffled repeat: each record twice or so.
  assert {(label, image) for _, label, image in got} <= set(_records(builder))
