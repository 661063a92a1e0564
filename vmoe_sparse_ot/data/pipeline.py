"""TFDS + tf.data input pipelines: one code path for embedded and real datasets.

Ordering rule: the global stream of examples is the same whatever the number of
processes P. Global batch t is stream positions [t*P*b, (t+1)*P*b) (`b` the
per-process batch) and process p contributes rows [p*b, (p+1)*b) of it.

Two ways to produce that stream (`sampling`; `data.streams` builds both):
- 'index' (default): position i of the training stream is record
  `sampling.record_indices(i)` of the split, a seeded per-epoch permutation
  computed from i (`data.sampling`), read by random access (`data.records`).
  Each process reads only its own 1/P of the
  records, and a restart at step t computes its first positions instead of
  replaying t*P*b of them: the time to the first batch does not grow with t.
- 'stream' (the former pipeline, kept for runs started with it): TFDS's reader
  with file shuffling and a `shuffle_buffer`; every process reads (not decodes)
  the whole record stream, keeps its rows, and a restart skips t*P*b still-encoded
  examples.

Each example is preprocessed by a pp string (`data.pp`, docs/PREPROCESSING.md)
from {'image': encoded image, 'label': int64}. Training streams are endless,
deterministic and augmented with stateless per-example seeds `(shuffle_seed, i)`.
Evaluation streams are a single pass in split order, padded with zero images to
whole global batches, with `'mask'` False on padding: every example is counted
exactly once.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vmoe_sparse_ot import errors
from vmoe_sparse_ot.data import embedded
from vmoe_sparse_ot.data import pp as pp_lib
from vmoe_sparse_ot.data import streams

AUGMENTATIONS = ('none', 'inception_crop_flip')
SAMPLINGS = ('index', 'stream')
# Small datasets are cached in memory (encoded for 'stream' training, preprocessed for eval).
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


def check_dataset(name: str, splits: Sequence[str], data_dir: str | None = None,
                  label_key: str = 'label') -> int:
  """Checks that `name` and its `splits` can be read; returns its number of classes.

  `label_key`: the feature read as the example's 'label' (a class label, or a
  sequence of them for multi-label data such as ImageNet ReaL's 'real_label').
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
                       f'{errors.first_line(e)}') from None
  return _label_classes(builder, name, label_key)


def _label_classes(builder, name: str, label_key: str) -> int:
  features = builder.info.features
  if label_key not in features:
    raise ValueError(f'dataset {name!r} has no feature {label_key!r} (features: '
                     f'{", ".join(sorted(features))})')
  feature = features[label_key]
  feature = getattr(feature, 'feature', feature)  # A Sequence of class labels.
  if not hasattr(feature, 'num_classes'):
    raise ValueError(f'feature {label_key!r} of dataset {name!r} is not a class label '
                     f'({type(feature).__name__})')
  return feature.num_classes


def label_shape(name: str, label_key: str = 'label', data_dir: str | None = None) -> tuple:
  """() for one class per example at `label_key`, (None,) for a sequence of them."""
  if name in embedded.BUILDERS:
    data_dir = data_dir or embedded.default_data_dir()
  feature = get_builder(name, data_dir).info.features[label_key]
  return (None,) if hasattr(feature, 'feature') else ()


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
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f'process_index={process_index} must be in [0, {process_count})')
  return process_index, process_count


def legacy_pp(augment: str, *, image_size: int, channels: int, training: bool,
              stored_shape: tuple[int | None, ...] | None = None) -> str:
  """The pp string that an `augment` mode stands for (`augment` predates pp strings).

  'none': decode, resize to image_size (skipped when the stored images already have
  that size), values to [-1, 1]. 'inception_crop_flip': in training a random resized
  crop (8-100% of the area, aspect ratio 3/4-4/3) and a random flip; in evaluation
  the shorter side to image_size * 256 / 224, then the central image_size square.
  """
  if augment not in AUGMENTATIONS:
    raise ValueError(f'augment={augment!r}; valid: {AUGMENTATIONS}')
  decode = f'decode(channels={channels})'
  if augment == 'none':
    same = stored_shape is not None and tuple(stored_shape[:2]) == (image_size, image_size)
    resize = '' if same else f'|resize({image_size}, antialias=True)'
    return f'{decode}{resize}|value_range(-1, 1)'
  if training:
    return (f'{decode}|inception_crop({image_size}, area_min=8, ratio_min=0.75, '
            'ratio_max=1.3333333333333333, antialias=True)|flip_lr|value_range(-1, 1)')
  small = int(round(image_size * 256 / 224))
  return (f"{decode}|resize_small({small}, method='bilinear', antialias=True)|"
          f'central_crop({image_size})|value_range(-1, 1)')


def _finish(example: dict[str, Any], *, image_size: int, channels: int,
            pp: str) -> dict[str, Any]:
  """The pp output as the model reads it: 'image' float32 (S, S, C), 'label' int32.

  Raises ValueError (while tf.data traces the pp function, so before any
  example is read) for an output the model cannot take.
  """
  example = {k: v for k, v in example.items() if k != pp_lib.SEED_KEY}
  want = (image_size, image_size, channels)
  image = example.get('image')
  if image is None:
    raise ValueError(f'pp {pp!r} leaves no entry \'image\' (entries: '
                     f'{", ".join(sorted(example))})')
  if image.dtype != tf.float32 or not image.shape.is_compatible_with(want):
    raise ValueError(f'pp {pp!r} gives \'image\' {image.dtype.name} of shape '
                     f'{tuple(image.shape)}; the model reads float32 {want} '
                     '(config.dataset.image_size, channels): end with a resize or crop to '
                     'that size and value_range')
  example['image'] = tf.ensure_shape(image, want)
  if 'label' in example:
    example['label'] = tf.cast(example['label'], tf.int32)
  return example


def image_shape(name: str, data_dir: str | None = None) -> tuple[int | None, ...]:
  """(H, W, C) of the images stored in dataset `name`, from its TFDS info; None varies."""
  if name in embedded.BUILDERS:
    data_dir = data_dir or embedded.default_data_dir()
  return tuple(get_builder(name, data_dir).info.features['image'].shape)


def declared_image_shape(name: str, data_dir: str | None = None) -> tuple[int | None, ...]:
  """(H, W, C) of the images of dataset `name` as its builder declares them (None where
  they vary), without its data: a TFDS builder's features are defined in its code.

  Raises ValueError for a name that is neither embedded nor registered in TFDS.
  """
  if name in embedded.BUILDERS:
    return tuple(embedded.BUILDERS[name].IMAGE_SHAPE)
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    embedded_names = ', '.join(sorted(embedded.BUILDERS))
    raise ValueError(f'dataset {name!r} is neither embedded ({embedded_names}) nor a '
                     'registered TFDS dataset') from None
  return tuple(builder.info.features['image'].shape)


def trace_pp(pp: str, *, training: bool, image_size: int, channels: int,
             label_shape: Sequence[int | None] = (),
             stored_shape: Sequence[int | None] | None = None,
             label_key: str = 'label') -> dict[str, tf.TensorSpec]:
  """The output entries of `pp` traced on an encoded image and a label, without data.

  `label_shape`: () for one integer class per example, (None,) for a sequence of
  them (multi-label). `stored_shape`: (H, W, C) of the dataset's stored images
  (`image_shape`), when known: the pp then also runs once on a blank image of that
  shape, so that an output of another size is caught here (a pp string without a
  resize, say) rather than after the model compiled. Raises ValueError (one line)
  when `pp` does not build or its 'image' is not float32 (image_size, image_size,
  channels); a size mismatch names both sizes and the op to add. `label_key`:
  the feature read as 'label', also there under its own name (`streams.example`).
  """
  preprocess = pp_lib.build(pp, training=training)
  spec = {'image': tf.TensorSpec([], tf.string),
          'label': tf.TensorSpec(list(label_shape), tf.int64)}
  if label_key != 'label':  # The label feature under its own name too (`streams.example`).
    spec[label_key] = spec['label']
  if training:
    spec[pp_lib.SEED_KEY] = tf.TensorSpec([2], tf.int64)

  traced_image = []

  def run(example):
    example = preprocess(example)
    traced_image.append(example.get('image'))
    return _finish(example, image_size=image_size, channels=channels, pp=pp)

  out = tf.function(run, autograph=False).get_concrete_function(spec).structured_outputs
  want = (image_size, image_size, channels)
  varying = not traced_image[0].shape.is_fully_defined()
  if stored_shape is not None and all(isinstance(d, int) for d in stored_shape):
    blank = _blank_example(stored_shape, label_shape, training)
    if label_key != 'label':
      blank[label_key] = blank['label']
    got = tuple(preprocess(blank)['image'].shape)
    if got != want:
      raise ValueError(_size_problem(pp, got, want, f'stored {tuple(stored_shape)} images'))
  elif varying and stored_shape is not None:
    raise ValueError(_size_problem(pp, tuple(traced_image[0].shape), want,
                                   f'stored images of varying size {tuple(stored_shape)}'))
  return {k: tf.TensorSpec(v.shape, v.dtype) for k, v in out.items()}


def _blank_example(stored_shape, label_shape, training: bool) -> dict[str, tf.Tensor]:
  """One example as the pipeline reads it: a black PNG of `stored_shape`, label 0."""
  image = tf.io.encode_png(tf.zeros(stored_shape, tf.uint8))
  label = tf.zeros([1 if d is None else d for d in label_shape], tf.int64)
  example = {'image': image, 'label': label}
  if training:
    example[pp_lib.SEED_KEY] = tf.constant([0, 0], tf.int64)
  return example


def _size_problem(pp: str, got: tuple, want: tuple, source: str) -> str:
  """One line: the pp's image size, the model's, and the op that makes them agree."""
  calls = pp_lib.parse(pp)
  decode_at = next((i for i, c in enumerate(calls) if c.name.startswith('decode')), None)
  texts = [c.text for c in calls]
  # (The channels are static after decode: a wrong count fails in `_finish` already.)
  at = 0 if decode_at is None else decode_at + 1
  fixed = '|'.join(texts[:at] + [f'resize({want[0]})'] + texts[at:])
  after = f' after {texts[decode_at]}' if decode_at is not None else ''
  fix = f'add resize({want[0]}){after}: {fixed!r}'
  return (f"pp {pp!r} gives 'image' of shape {got} from the dataset's {source}; the model "
          f'reads {want} (image_size={want[0]}, channels={want[2]}): {fix}')


def check_pp(pp: str, *, training: bool, image_size: int, channels: int) -> None:
  """Builds and traces `pp` on an encoded image and an integer label, without data.

  Raises ValueError (one line) when it does not build or its output is not
  'image' float32 (image_size, image_size, channels) with an integer 'label'
  (the trainer's loss reads integer labels).
  """
  out = trace_pp(pp, training=training, image_size=image_size, channels=channels)
  label = out.get('label')
  if label is None or label.shape.rank != 0:
    raise ValueError(f'pp {pp!r} leaves no integer \'label\' (entries: '
                     f'{", ".join(sorted(out))}); the trainer reads it (an onehot op '
                     "may write its result elsewhere: key_result='labels')")


def make_dataset(name: str, split: str, *, batch_size: int, image_size: int,
                 channels: int, training: bool, data_dir: str | None = None,
                 shuffle_seed: int = 0, shuffle_buffer: int = 10_000,
                 process_index: int | None = None, process_count: int | None = None,
                 start_step: int = 0, augment: str | None = None,
                 pp: str | None = None, label_key: str = 'label',
                 sampling: str = 'index') -> tf.data.Dataset:
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
    shuffle_seed: seeds the order of the records and augmentation.
    shuffle_buffer: examples in the shuffle buffer ('stream' sampling only).
    process_index, process_count: p and P; default from JAX.
    start_step: training only: skip this many global batches (resume position).
    augment: the older spelling of `pp` (see `legacy_pp`): 'none' or
      'inception_crop_flip'; None (with pp None) picks 'none' for the embedded digit
      datasets and 'inception_crop_flip' otherwise.
    pp: a preprocessing string (docs/PREPROCESSING.md) applied to each example
      {'image': encoded image string, 'label': int64}; random ops only in training.
      Its output must hold 'image' float32 (image_size, image_size, channels).
    label_key: the dataset's feature read as the example's 'label' (e.g.
      'real_label', a sequence of classes; the pp then turns it into fixed-size
      'labels' and drops it).
    sampling: 'index' (each process reads its own records by random access; a
      restart costs the same at any step) or 'stream' (the former pipeline: every
      process reads the whole stream; a restart replays it); see the module doc.

  Returns:
    A tf.data.Dataset of dicts: the pp output batched, 'image' float32
    (b, image_size, image_size, channels), 'label' int32 (b,) when the pp output
    keeps it, and for evaluation 'mask' bool (b,).
  """
  if batch_size <= 0:
    raise ValueError(f'batch_size={batch_size} must be positive')
  if augment is not None and pp is not None:
    raise ValueError(f'augment={augment!r} and pp={pp!r}: give one (augment is the older '
                     'spelling of a pp string)')
  if augment is not None and augment not in AUGMENTATIONS:
    raise ValueError(f'augment={augment!r}; valid: {AUGMENTATIONS}')
  if sampling not in SAMPLINGS:
    raise ValueError(f'sampling={sampling!r}; valid: {SAMPLINGS}')
  if start_step and not training:
    raise ValueError('start_step applies to training streams only')
  data_dir = data_dir or (embedded.default_data_dir() if name in embedded.BUILDERS else None)
  process_index, process_count = _process_defaults(process_index, process_count)
  builder = get_builder(name, data_dir)
  image_feature = builder.info.features['image']
  num = builder.info.splits[split].num_examples
  global_batch = batch_size * process_count
  if pp is None:
    augment = augment or ('none' if name in embedded.BUILDERS else 'inception_crop_flip')
    pp = legacy_pp(augment, image_size=image_size, channels=channels, training=training,
                   stored_shape=image_feature.shape)
  try:
    preprocess = pp_lib.build(pp, training=training)
  except ValueError as e:
    raise ValueError(f'pp={pp!r}: {e}') from None

  def finish(example):
    return _finish(example, image_size=image_size, channels=channels, pp=pp)

  layout = dict(training=training, shuffle_seed=shuffle_seed, batch_size=batch_size,
                process_index=process_index, process_count=process_count,
                start_step=start_step, label_key=label_key)
  if sampling == 'index':
    ds = streams.index_examples(builder, split, **layout)
  else:
    cache = bool(builder.info.dataset_size and builder.info.dataset_size < _CACHE_MAX_BYTES)
    ds = streams.stream_examples(builder, split, shuffle_buffer=shuffle_buffer,
                                 cache=cache, **layout)
  options = tf.data.Options()
  options.deterministic = True
  ds = ds.with_options(options)

  if training:
    def train_map(i, ex):
      seed = tf.stack([tf.constant(shuffle_seed, tf.int64), i])
      return finish(preprocess({**ex, pp_lib.SEED_KEY: seed}))

    ds = ds.map(_no_autograph(train_map), num_parallel_calls=tf.data.AUTOTUNE)
    if pp_lib.VALID_KEY in ds.element_spec:  # `ignore_no_labels`: skip those examples.
      ds = ds.filter(lambda ex: ex[pp_lib.VALID_KEY]).map(
          lambda ex: {k: v for k, v in ex.items() if k != pp_lib.VALID_KEY})
    ds = ds.batch(batch_size, drop_remainder=True)
  else:
    num_batches = math.ceil(num / global_batch)

    def eval_map(_, ex):
      out = finish(preprocess(ex))
      # `ignore_no_labels`: an example without labels is masked out, as padding is.
      valid = out.pop(pp_lib.VALID_KEY, tf.constant(True))
      return {**out, 'mask': tf.cast(valid, tf.bool)}

    ds = ds.map(_no_autograph(eval_map), num_parallel_calls=tf.data.AUTOTUNE)
    # This process's real examples are a prefix of its share of the padded stream,
    # so padding at its end keeps every process at `num_batches` batches.
    padding = tf.data.Dataset.from_tensors(
        {k: tf.zeros(_fixed_shape(k, v, pp), v.dtype) for k, v in ds.element_spec.items()}
        | {'mask': tf.constant(False)}).repeat()
    ds = ds.concatenate(padding).take(num_batches * batch_size).batch(batch_size)
    if num_batches * global_batch * image_size**2 * channels * 4 < _CACHE_MAX_BYTES:
      ds = ds.cache()
  return ds.prefetch(tf.data.AUTOTUNE)


def _no_autograph(fn):
  # The pp ops are graph code already (tf.cond, tf.switch_case); autograph's rewrite
  # of them only costs time (seconds for RandAugment's branches).
  return tf.autograph.experimental.do_not_convert(fn)


def _fixed_shape(key: str, spec: tf.TensorSpec, pp: str) -> tuple[int, ...]:
  # Evaluation batches are padded with zeros, which needs every entry's shape.
  if not spec.shape.is_fully_defined():
    raise ValueError(f'pp {pp!r} gives entry {key!r} of varying shape {tuple(spec.shape)}; '
                     'evaluation needs fixed shapes (drop it with keep(...))')
  return tuple(spec.shape)


def to_global(batch: dict[str, np.ndarray], sharding: Any) -> dict[str, Any]:
  """Per-process numpy batch -> global jax.Arrays laid out by `sharding` (batch axis)."""
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)
