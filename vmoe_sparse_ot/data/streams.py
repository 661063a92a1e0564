"""Which encoded examples each process gets, in which order: the two `sampling` modes.

Both return (stream position i, {'image': encoded image, 'label': ...}) pairs of
this process (p of P, b examples a batch): global batch t is positions
[t*P*b, (t+1)*P*b) and process p holds rows [p*b, (p+1)*b) of it. Training
streams are endless and start at global batch `start_step`; evaluation streams
are one pass in split order. `data.pipeline` preprocesses and batches them.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vmoe_sparse_ot.data import records as records_lib
from vmoe_sparse_ot.data import sampling as sampling_lib


def example(features, label_key: str) -> dict:
  """The entries a pp string reads: 'image' (encoded), 'label' (the `label_key`
  feature) and, when that is another feature, the same tensor under its own name,
  so that a pp string written for the reference code (`onehot(1000,
  inkey="real_label", ...)`) reads it as there."""
  out = {'image': features['image'], 'label': features[label_key]}
  if label_key != 'label':
    out[label_key] = features[label_key]
  return out


def stream_examples(builder, split: str, *, training: bool, shuffle_seed: int,
                    shuffle_buffer: int, cache: bool, batch_size: int, process_index: int,
                    process_count: int, start_step: int, label_key: str) -> tf.data.Dataset:
  """(stream position i, encoded example) of this process, 'stream' sampling.

  TFDS's sequential reader (training: shuffled files, a seeded shuffle buffer over
  the repeated split); every process reads all of it and keeps positions i with
  (i // b) % P == p. A restart at step t skips t*P*b positions. `cache`: keep
  the encoded split in memory (small datasets).
  """
  ds = builder.as_dataset(
      split, shuffle_files=training, decoders={'image': tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(shuffle_seed=shuffle_seed, skip_prefetch=True))
  ds = ds.map(lambda ex: example(ex, label_key))

  def mine(i, _):
    return (i // batch_size) % process_count == process_index

  if not training:
    return ds.enumerate().filter(mine)
  if cache:
    ds = ds.cache()
  ds = ds.repeat().shuffle(shuffle_buffer, seed=shuffle_seed).enumerate()
  return ds.skip(start_step * batch_size * process_count).filter(mine)


def index_examples(builder, split: str, *, training: bool, shuffle_seed: int,
                   batch_size: int, process_index: int, process_count: int,
                   start_step: int, label_key: str) -> tf.data.Dataset:
  """(stream position i, encoded example) of this process, 'index' sampling.

  Reads only this process's records, by random access: training position i is
  record `sampling.record_indices(i)` (epoch i // N in its seeded order), from
  step `start_step` on; evaluation position i is record i, for i < N.
  """
  records = records_lib.open_split(builder, split)
  n, b = records.num_records, batch_size
  if training:
    local = tf.data.Dataset.range(start_step * b, tf.int64.max)
  else:
    local = tf.data.Dataset.range(math.ceil(n / (b * process_count)) * b)

  def read(local_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positions = sampling_lib.global_positions(local_positions, b, process_index,
                                              process_count)
    if training:
      indices = sampling_lib.record_indices(positions, n, shuffle_seed)
    else:
      positions = indices = positions[positions < n]
    return positions, np.asarray(records.read(indices), dtype=object)

  def read_batch(local_positions):
    positions, serialized = tf.numpy_function(read, [local_positions], (tf.int64, tf.string),
                                              stateful=False)
    return tf.ensure_shape(positions, [None]), tf.ensure_shape(serialized, [None])

  features = builder.info.features

  @tf.autograph.experimental.do_not_convert  # Graph code already.
  def parse(i, serialized):
    ex = features.deserialize_example(serialized,
                                      decoders={'image': tfds.decode.SkipDecoding()})
    return i, example(ex, label_key)

  ds = local.batch(b).map(read_batch, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
  return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
