"""TFDS + tf.data input pipelines: one code path for embedded and real datasets.

Ordering rule (why the pipeline looks the way it does): the global stream of
examples is the same whatever the number of processes. Process `p` of `P` keeps
the examples whose position `i` in the stream satisfies `(i // b) % P == p`
(`b` the per-process batch), so global batch `t` is examples `[t*P*b, (t+1)*P*b)`
in stream order, and process `p` contributes rows `[p*b, (p+1)*b)` of it. Hence
one process and several processes at the same global batch see identical global
batches, and a restarted run resumes at batch `t` by skipping `t*P*b` still-encoded
examples of the seeded stream before any decoding or augmentation. The price is
that every process reads (not decodes) the whole record stream.

Training streams are shuffled with a fixed seed, repeated and augmented with
stateless per-example seeds `(shuffle_seed, i)`, so they are deterministic.
Evaluation streams are a single pass, padded with zero images to whole global
batches, with `'mask'` False on padding: every example is counted exactly once.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vmoe_sparse_ot.data import embedded

AUGMENTATIONS = ('none', 'inception_crop_flip')
# Small datasets are cached in memory (encoded for training, preprocessed for eval).
_CACHE_MAX_BYTES = 512 * 2**20


def get_builder(name: str, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """The prepared TFDS builder for `name` (embedded datasets are prepared on demand).

  Raises ValueError for a name that is neither embedded nor registered in TFDS, and
  FileNotFoundError (one line: the dataset, the data_dir looked in, how to prepare
  it) for a TFDS dataset that is not prepared.
  """
  if name in embedded.BUILDERS:
    return embedded.builder(name, data_dir)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
        f'dataset {name!r} is neither embedded ({", ".join(sorted(embedded.BUILDERS))}) nor '
        'a registered TFDS dataset') from None
  if not builder.is_prepared():
    raise FileNotFoundError(
        f'TFDS dataset {name!r} is not prepared under data_dir {str(builder.data_dir_root)!r}; '
        f'this machine cannot download it: prepare it elsewhere (`tfds build {name} '
        f'--data_dir=DIR`), copy DIR here and set config.dataset.data_dir=DIR (embedded '
        f'datasets, prepared by `python -m vmoe_sparse_ot.data`: '
        f'{", ".join(sorted(embedded.BUILDERS))})')
  return builder


def check_dataset(name: str, splits: Sequence[str], data_dir: str | None = None) -> int:
  """Checks that `name` and its `splits` can be read; returns its number of classes.

  Cheap: it opens the builder's metadata only (an embedded dataset is written on
  first use). Meant to run before any model is built, so that a missing dataset
  fails in one line (FileNotFoundError or ValueError) rather than after minutes.
  """
  if name in embedded.BUILDERS:
    data_dir = data_dir or embedded.default_data_dir()
  builder = get_builder(name, data_dir)
  for split in splits:
    try:
      builder.info.splits[split]
    except (KeyError, ValueError) as e:
      raise ValueError(f'dataset {name!r} has no split {split!r} '
                       f'(available: {", ".join(sorted(builder.info.splits))}): '
                       f'{str(e).splitlines()[0] if str(e) else type(e).__name__}') from None
  return builder.info.features['label'].num_classes


def num_classes(name: str, data_dir: str | None = None) -> int:
  """Number of label classes of dataset `name`."""
  if name in embedded.BUILDERS:
    return embedded.BUILDERS[name].NUM_CLASSES
  return get_builder(name, data_dir).info.features['label'].num_classes


def num_examples(name: str, split: str, data_dir: str | None = None) -> int:
  """Examples in `split` (TFDS split syntax such as 'train[:1000]' is accepted)."""
  return get_builder(name, data_dir).info.splits[split].num_examples


def _process_defaults(process_index, process_count) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} must be in [0, {process_count})')
  return process_index, process_count


def _to_channels(image: tf.Tensor, channels: int) -> tf.Tensor:
  have = image.shape[-1]
  if have == channels:
    return image
  if have == 1 and channels == 3:
    return tf.image.grayscale_to_rgb(image)
  if have == 3 and channels == 1:
    return tf.image.rgb_to_grayscale(image)
  raise ValueError(f'cannot convert {have} image channels to channels={channels}')


def _inception_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), tf.zeros([0, 0, 4], tf.float32), seed=seed,
      area_range=(0.08, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
      min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
  return tf.slice(image, begin, size)


def _resize_small_central_crop(image: tf.Tensor, image_size: int) -> tf.Tensor:
  # Eval for natural images: shorter side to image_size * 256 / 224, central crop.
  small = int(round(image_size * 256 / 224))
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  scale = small / tf.reduce_min(shape)
  new = tf.cast(tf.round(shape * scale), tf.int32)
  image = tf.image.resize(image, new, antialias=True)
  top = (new[0] - image_size) // 2
  left = (new[1] - image_size) // 2
  return image[top:top + image_size, left:left + image_size]


def _preprocess(image: tf.Tensor, *, image_size: int, channels: int, augment: str,
                training: bool, seed: tf.Tensor | None) -> tf.Tensor:
  """uint8 (H, W, C0) -> float32 (image_size, image_size, channels) in [-1, 1]."""
  image = _to_channels(image, channels)
  if augment == 'inception_crop_flip':
    if training:
      crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
      image = _inception_crop(image, crop_seed)
      image = tf.image.resize(image, (image_size, image_size), antialias=True)
      image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    else:
      image = _resize_small_central_crop(image, image_size)
  elif image.shape[0] != image_size or image.shape[1] != image_size:
    image = tf.image.resize(image, (image_size, image_size), antialias=True)
  image = tf.ensure_shape(tf.cast(image, tf.float32), (image_size, image_size, channels))
  return image * (2.0 / 255.0) - 1.0


def make_dataset(name: str, split: str, *, batch_size: int, image_size: int,
                 channels: int, training: bool, data_dir: str | None = None,
                 shuffle_seed: int = 0, shuffle_buffer: int = 10_000,
                 process_index: int | None = None, process_count: int | None = None,
                 start_step: int = 0, augment: str | None = None) -> tf.data.Dataset:
  """Batched examples of `name`/`split` for this process.

  Args:
    name: an embedded dataset ('embedded_mnist', 'sklearn_digits') or a prepared TFDS
      dataset under `data_dir`.
    split: TFDS split, slicing allowed ('train[:2000]').
    batch_size: b, examples per batch on this process (global batch is b * P).
    image_size, channels: output image shape (image_size, image_size, channels).
    training: True: shuffled, repeated, augmented stream without 'mask';
      False: one pass padded to whole batches with a bool 'mask' (False = padding).
    data_dir: TFDS data_dir; None means `$VMOE_DATA_DIR` or
      `~/.cache/vmoe_sparse_ot/tfds` for embedded datasets, TFDS's default otherwise.
    shuffle_seed: seeds file order, the shuffle buffer and augmentation.
    shuffle_buffer: examples in the shuffle buffer.
    process_index, process_count: p and P; default from JAX.
    start_step: training only: skip this many global batches (resume position).
    augment: 'none' or 'inception_crop_flip' (random resized crop and flip in training,
      resize + central crop in eval); None picks 'none' for the embedded digit
      datasets and 'inception_crop_flip' otherwise.

  Returns:
    A tf.data.Dataset of dicts 'image' float32 (b, image_size, image_size, channels)
    in [-1, 1], 'label' int32 (b,), and for evaluation 'mask' bool (b,).
  """
  if batch_size <= 0:
    raise ValueError(f'batch_size={batch_size} must be positive')
  if augment is None:
    augment = 'none' if name in embedded.BUILDERS else 'inception_crop_flip'
  if augment not in AUGMENTATIONS:
    raise ValueError(f'augment={augment!r}; valid: {AUGMENTATIONS}')
  if start_step and not training:
    raise ValueError('start_step applies to training streams only')
  data_dir = data_dir or (embedded.default_data_dir() if name in embedded.BUILDERS else None)
  process_index, process_count = _process_defaults(process_index, process_count)
  builder = get_builder(name, data_dir)
  image_feature = builder.info.features['image']
  num = builder.info.splits[split].num_examples
  global_batch = batch_size * process_count
  preprocess_kwargs = dict(image_size=image_size, channels=channels, augment=augment,
                           training=training)

  ds = builder.as_dataset(
      split, shuffle_files=training, decoders={'image': tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(shuffle_seed=shuffle_seed, skip_prefetch=True))
  ds = ds.map(lambda ex: {'image': ex['image'], 'label': ex['label']})
  options = tf.data.Options()
  options.deterministic = True
  ds = ds.with_options(options)

  def mine(i, _):
    return (i // batch_size) % process_count == process_index

  def decode(ex):
    image = tf.cast(image_feature.decode_example(ex['image']), tf.uint8)
    return tf.ensure_shape(image, image_feature.shape)

  if training:
    if builder.info.dataset_size and builder.info.dataset_size < _CACHE_MAX_BYTES:
      ds = ds.cache()
    ds = ds.repeat().shuffle(shuffle_buffer, seed=shuffle_seed).enumerate()
    ds = ds.skip(start_step * global_batch).filter(mine)

    def train_map(i, ex):
      seed = tf.stack([tf.constant(shuffle_seed, tf.int64), i])
      image = _preprocess(decode(ex), seed=seed, **preprocess_kwargs)
      return {'image': image, 'label': tf.cast(ex['label'], tf.int32)}

    ds = ds.map(train_map, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.batch(batch_size, drop_remainder=True)
  else:
    num_batches = math.ceil(num / global_batch)

    def eval_map(_, ex):
      image = _preprocess(decode(ex), seed=None, **preprocess_kwargs)
      return {'image': image, 'label': tf.cast(ex['label'], tf.int32),
              'mask': tf.constant(True)}

    ds = ds.enumerate().filter(mine).map(eval_map, num_parallel_calls=tf.data.AUTOTUNE)
    # This process's real examples are a prefix of its share of the padded stream,
    # so padding at its end keeps every process at `num_batches` batches.
    padding = tf.data.Dataset.from_tensors({
        'image': tf.zeros((image_size, image_size, channels), tf.float32),
        'label': tf.constant(0, tf.int32), 'mask': tf.constant(False)}).repeat()
    ds = ds.concatenate(padding).take(num_batches * batch_size).batch(batch_size)
    if num_batches * global_batch * image_size**2 * channels * 4 < _CACHE_MAX_BYTES:
      ds = ds.cache()
  return ds.prefetch(tf.data.AUTOTUNE)


def to_global(batch: dict[str, np.ndarray], sharding: Any) -> dict[str, Any]:
  """Per-process numpy batch -> global jax.Arrays laid out by `sharding` (batch axis)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
