"""Random access to TFDS split records: tfrecord offsets, array_record, split slicing."""
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from vmoe_sparse_ot.data import embedded
from vmoe_sparse_ot.data import records


def test_tfrecord_offsets_by_hand(tmp_path):
  path = str(tmp_path / 'x.tfrecord')
  with tf.io.TFRecordWriter(path) as writer:
    for record in (b'abc', b'', b'hello'):
      writer.write(record)
  # Each record: 8-byte length, 4-byte CRC, the data, 4-byte CRC.
  size = (tmp_path / 'x.tfrecord').stat().st_size
  starts = records.tfrecord_offsets(path, size, 0)
  np.testing.assert_array_equal(starts, [0, 3 + 16, 3 + 16 + 16, 3 + 16 + 16 + 5 + 16])
  assert starts[-1] == size
  split = records.SplitRecords([(path, 1, 2), (path, 0, 3)], 'tfrecord')
  assert split.num_records == 5
  assert split.read([4, 0, 1, 2]) == [b'hello', b'', b'hello', b'abc']
  with pytest.raises(IndexError, match=r'\[0, 5\)'):
    split.read([5])
  with pytest.raises(ValueError, match='runs past the end'):
    records.tfrecord_offsets(path, size - 1, 1)


def test_array_record_files(tmp_path):
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'x.array_record')
  writer = array_record_module.ArrayRecordWriter(path, 'group_size:1')
  for record in (b'a', b'bb', b'ccc'):
    writer.write(record)
  writer.close()
  split = records.SplitRecords([(path, 1, 2)], 'array_record')
  assert split.num_records == 2 and split.read([1, 0]) == [b'ccc', b'bb']
  # A TFDS builder prepared with file_format='array_record' (preparing a real one
  # takes seconds): open_split reads its format and file instructions.
  instruction = types.SimpleNamespace(filename=path, skip=0, take=3)
  info = types.SimpleNamespace(
      file_format=tfds.core.FileFormat.ARRAY_RECORD,
      splits={'train': types.SimpleNamespace(file_instructions=[instruction])})
  split = records.open_split(types.SimpleNamespace(info=info), 'train')
  assert split.read([2, 0]) == [b'ccc', b'a']
  with pytest.raises(ValueError, match="file_format='riegeli'"):
    records.SplitRecords([(path, 0, 1)], 'riegeli')


def test_split_records_match_tfds_reader():
  builder = embedded.builder('sklearn_digits')
  split = records.open_split(builder, 'train[100:300]')
  assert split.num_records == 200
  ordered = list(builder.as_dataset('train[100:300]', decoders={
      'image': tfds.decode.SkipDecoding()}).as_numpy_iterator())
  for k, serialized in zip([0, 5, 199], split.read([0, 5, 199])):
    ex = builder.info.features.deserialize_example(
        serialized, decoders={'image': tfds.decode.SkipDecoding()})
    assert ex['image'].numpy() == ordered[k]['image']
    assert ex['label'].numpy() == ordered[k]['label']
