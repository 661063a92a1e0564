"""Preprocessing ops on any entry: value ranges, one-hot labels, keeping and copying entries.

Arguments and defaults follow the reference V-MoE / big_vision pp ops of the same
names, so their pp strings read the same here (docs/PREPROCESSING.md).
"""
from __future__ import annotations

import numbers

from vmoe_sparse_ot.data.pp_registry import Example
from vmoe_sparse_ot.data.pp_registry import Op
from vmoe_sparse_ot.data.pp_registry import SEED_KEY
from vmoe_sparse_ot.data.pp_registry import VALID_KEY
from vmoe_sparse_ot.data.pp_registry import get
from vmoe_sparse_ot.data.pp_registry import image_op
from vmoe_sparse_ot.data.pp_registry import register
from vmoe_sparse_ot.data.pp_registry import tf


def _is_number(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _numbers(x) -> bool:
  """A number, or a non-empty sequence of numbers (one per channel)."""
  if isinstance(x, (tuple, list)):
    return bool(x) and all(_is_number(v) for v in x)
  return _is_number(x)


@image_op('value_range')
def value_range(vmin=-1, vmax=1, in_min=0, in_max=255.0, clip_values=False):
  """Maps [in_min, in_max] linearly onto [vmin, vmax], as float32.

  `in_min`/`in_max` may be one value per channel. `clip_values` clips the result
  to [vmin, vmax].
  """
  for name, value in (('vmin', vmin), ('vmax', vmax)):
    if not _is_number(value):
      raise ValueError(f'{name}={value!r} must be a number')
  for name, value in (('in_min', in_min), ('in_max', in_max)):
    if not _numbers(value):
      raise ValueError(f'{name}={value!r} must be a number or one number per channel')
  if _is_number(in_min) and _is_number(in_max) and in_min == in_max:
    raise ValueError(f'in_min={in_min!r} and in_max={in_max!r} must differ')
  if clip_values not in (True, False):
    raise ValueError(f'clip_values={clip_values!r} must be True or False')

  def apply(image):
    lo = tf.constant(in_min, tf.float32)
    hi = tf.constant(in_max, tf.float32)
    unit = (tf.cast(image, tf.float32) - lo) / (hi - lo)
    image = vmin + unit * (vmax - vmin)
    if clip_values:
      image = tf.clip_by_value(image, min(vmin, vmax), max(vmin, vmax))
    return image

  return apply


@register('onehot')
def onehot(depth, key='labels', key_result=None, multi=True, on=1.0, off=0.0) -> Op:
  """One-hot (float32 (depth,)) encoding of the integer label(s) at `key`.

  Label smoothing s over K classes is `on=1 - s + s/K, off=s/K`. A vector of
  labels (multi-label data) becomes one multi-hot vector when `multi`, else one
  one-hot row per label. The result goes to `key_result` (default: `key`).
  """
  if not (isinstance(depth, int) and not isinstance(depth, bool) and depth >= 1):
    raise ValueError(f'depth={depth!r} must be a positive integer (the number of classes)')
  for name, value in (('key', key), ('key_result', key_result)):
    if not (isinstance(value, str) and value) and not (name == 'key_result' and value is None):
      raise ValueError(f'{name}={value!r} must be the name of an entry')
  for name, value in (('on', on), ('off', off)):
    if not _is_number(value):
      raise ValueError(f'{name}={value!r} must be a number')
  if multi not in (True, False):
    raise ValueError(f'multi={multi!r} must be True or False')

  def op(data: Example) -> Example:
    labels = tf.cast(get(data, key, 'onehot'), tf.int64)
    if labels.shape.rank and multi:
      hits = tf.scatter_nd(labels[:, None], tf.ones(tf.shape(labels)[:1]), (depth,))
      encoded = tf.minimum(hits, 1.0) * (on - off) + off
    else:
      encoded = tf.one_hot(labels, depth, on_value=float(on), off_value=float(off))
    return {**data, key_result or key: encoded}

  return op


def _entry_names(names, what: str) -> None:
  if not names or not all(isinstance(n, str) and n for n in names):
    raise ValueError(f'{what} must be one or more entry names, got {names!r}')


@register('keep')
def keep(*keys) -> Op:
  """Keeps only the named entries (and the per-example seed, while random ops run, and
  `ignore_no_labels`' flag)."""
  _entry_names(keys, 'keys')

  def op(data: Example) -> Example:
    return {k: v for k, v in data.items() if k in keys or k in (SEED_KEY, VALID_KEY)}

  return op


@register('drop')
def drop(*keys) -> Op:
  """Removes the named entries (absent ones are ignored)."""
  _entry_names(keys, 'keys')

  def op(data: Example) -> Example:
    return {k: v for k, v in data.items() if k not in keys}

  return op


@register('copy')
def copy(inkey, outkey) -> Op:
  """Copies entry `inkey` to `outkey` (tensors are immutable: no data is copied)."""
  _entry_names((inkey, outkey), 'inkey and outkey')

  def op(data: Example) -> Example:
    return {**data, outkey: get(data, inkey, 'copy')}

  return op


@register('ignore_no_labels')
def ignore_no_labels(labels_key='labels', valid_key=VALID_KEY) -> Op:
  """Marks an example whose `labels_key` holds no label (ImageNet ReaL has images
  without any) as not counting: training skips it, evaluation masks it out."""
  _entry_names((labels_key,), 'labels_key')
  if valid_key != VALID_KEY:
    raise ValueError(f'valid_key={valid_key!r}: the pipeline reads {VALID_KEY!r} only')

  def op(data: Example) -> Example:
    labels = get(data, labels_key, 'ignore_no_labels')
    valid = tf.size(labels) > 0
    if VALID_KEY in data:
      valid = tf.logical_and(tf.cast(data[VALID_KEY], tf.bool), valid)
    return {**data, VALID_KEY: valid}

  return op


@register('flatten')
def flatten() -> Op:
  """Nested entries (a TFDS feature dict) become 'outer/inner' entries."""

  def op(data: Example) -> Example:
    out = {}

    def visit(prefix, value):
      if isinstance(value, dict):
        for k, v in value.items():
          visit(f'{prefix}/{k}' if prefix else k, v)
      else:
        out[prefix] = value

    visit('', data)
    return out

  return op

