"""Image preprocessing ops: decoding, crops, resizes, flips.

Images are (H, W, C) tensors; ops that resize keep the input's dtype (an integer
image is rounded and clipped back to its range, where the reference truncates).
Arguments and defaults follow the reference V-MoE / big_vision ops of the same
names (crop areas in percent of the image, e.g. `area_min=5`). Random ops draw
from the example's stateless seed, so a seeded training stream is reproducible.
"""
from __future__ import annotations

import numbers

from vmoe_sparse_ot.data.pp_registry import image_op
from vmoe_sparse_ot.data.pp_registry import tf
from vmoe_sparse_ot.values import is_int

RESIZE_METHODS = ('bilinear', 'nearest', 'bicubic', 'area', 'lanczos3', 'lanczos5',
                  'gaussian', 'mitchellcubic')


def _size(size, what: str) -> tuple[int, int]:
  """An int H (square) or a pair (H, W) of positive ints -> (H, W)."""
  if is_int(size) and size >= 1:
    return size, size
  if (isinstance(size, (tuple, list)) and len(size) == 2
      and all(is_int(s) and s >= 1 for s in size)):
    return int(size[0]), int(size[1])
  raise ValueError(f'{what}={size!r} must be a positive integer or a pair (height, width)')


def _check_resize(method, antialias) -> None:
  if method not in RESIZE_METHODS:
    raise ValueError(f'method={method!r} must be one of {list(RESIZE_METHODS)}')
  if antialias not in (True, False):
    raise ValueError(f'antialias={antialias!r} must be True or False')


def _check_crop_ranges(area_min, area_max, ratio_min, ratio_max) -> None:
  for name, value in (('area_min', area_min), ('area_max', area_max),
                      ('ratio_min', ratio_min), ('ratio_max', ratio_max)):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or value <= 0:
      raise ValueError(f'{name}={value!r} must be a positive number')
  if not area_min <= area_max <= 100:
    raise ValueError(f'area_min={area_min!r}, area_max={area_max!r} must satisfy '
                     '0 < area_min <= area_max <= 100 (percent of the image)')
  if ratio_min > ratio_max:
    raise ValueError(f'ratio_min={ratio_min!r} must be <= ratio_max={ratio_max!r}')


def _check_channels(channels) -> None:
  if channels not in (1, 3):
    raise ValueError(f'channels={channels!r} must be 1 or 3')


def resize_to(image, size, method: str = 'bilinear', antialias: bool = False):
  """`image` resized to `size` (H, W), in its own dtype."""
  dtype = image.dtype
  resized = tf.image.resize(image, size, method=method, antialias=antialias)
  if resized.dtype == dtype:
    return resized
  if dtype.is_integer:
    # Round, not truncate: resizing to the same size is then the identity.
    resized = tf.clip_by_value(tf.round(resized), dtype.min, dtype.max)
  return tf.cast(resized, dtype)


def _sample_crop(shape, seed, area_min, area_max, ratio_min, ratio_max):
  """(begin, size) of a random crop of an image of `shape` (H, W, C)."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, tf.zeros([0, 0, 4], tf.float32), seed=seed,
      area_range=(area_min / 100, area_max / 100), aspect_ratio_range=(ratio_min, ratio_max),
      min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
  return begin, size


@image_op('decode')
def decode(channels=3):
  """Encoded image (JPEG, PNG, GIF, BMP string) -> uint8 (H, W, channels).

  Grey images become RGB with channels=3, colour ones grey with channels=1.
  """
  _check_channels(channels)

  def apply(data):
    image = tf.io.decode_image(data, channels=channels, expand_animations=False)
    image.set_shape([None, None, channels])
    return image

  return apply


@image_op('resize')
def resize(size, method='bilinear', antialias=False):
  """Resizes to `size` (an int: square; or (height, width)), aspect ratio not kept."""
  size = _size(size, 'size')
  _check_resize(method, antialias)
  return lambda image: resize_to(image, size, method, antialias)


@image_op('resize_small')
def resize_small(smaller_size, method='area', antialias=False):
  """Resizes so that the shorter side is `smaller_size`, keeping the aspect ratio."""
  if not (is_int(smaller_size) and smaller_size >= 1):
    raise ValueError(f'smaller_size={smaller_size!r} must be a positive integer')
  _check_resize(method, antialias)

  def apply(image):
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    factor = smaller_size / tf.reduce_min(shape)
    return resize_to(image, tf.cast(tf.round(shape * factor), tf.int32), method, antialias)

  return apply


@image_op('central_crop')
def central_crop(crop_size=None):
  """The central `crop_size` (int or (height, width)); None: the largest central square."""
  size = None if crop_size is None else _size(crop_size, 'crop_size')

  def apply(image):
    shape = tf.shape(image)
    h, w = size if size else (tf.minimum(shape[0], shape[1]),) * 2
    return tf.image.crop_to_bounding_box(image, (shape[0] - h) // 2, (shape[1] - w) // 2, h, w)

  return apply


@image_op('random_crop', random=True)
def random_crop(crop_size):
  """A uniformly placed crop of `crop_size` (int or (height, width))."""
  size = _size(crop_size, 'crop_size')

  def apply(image, seed):
    return tf.image.stateless_random_crop(image, (*size, tf.shape(image)[-1]), seed=seed)

  return apply


@image_op('flip_lr', random=True)
def flip_lr():
  """Mirrors the image left-right with probability 1/2."""
  return lambda image, seed: tf.image.stateless_random_flip_left_right(image, seed)


@image_op('inception_crop', random=True)
def inception_crop(size=None, area_min=5, area_max=100, ratio_min=0.75, ratio_max=1.33,
                   method='bilinear', antialias=False):
  """Random crop of area in [area_min, area_max] % and aspect ratio in [ratio_min,
  ratio_max] (the whole image when no such crop is found), resized to `size` if given."""
  out_size = None if size is None else _size(size, 'size')
  _check_crop_ranges(area_min, area_max, ratio_min, ratio_max)
  _check_resize(method, antialias)

  def apply(image, seed):
    begin, crop = _sample_crop(tf.shape(image), seed, area_min, area_max, ratio_min, ratio_max)
    crop_image = tf.slice(image, begin, crop)
    crop_image.set_shape([None, None, image.shape[-1]])  # tf.slice loses the channels.
    return resize_to(crop_image, out_size, method, antialias) if out_size else crop_image

  return apply


@image_op('decode_jpeg_and_inception_crop', random=True)
def decode_jpeg_and_inception_crop(size=None, area_min=5, area_max=100, ratio_min=0.75,
                                   ratio_max=1.33, method='bilinear', antialias=False,
                                   channels=3):
  """`decode|inception_crop(...)` that decodes only the crop of a JPEG (faster on
  large photos). Other formats are decoded whole, then cropped the same way."""
  out_size = None if size is None else _size(size, 'size')
  _check_crop_ranges(area_min, area_max, ratio_min, ratio_max)
  _check_resize(method, antialias)
  _check_channels(channels)

  def jpeg(data, seed):
    shape = tf.image.extract_jpeg_shape(data)
    begin, crop = _sample_crop(shape, seed, area_min, area_max, ratio_min, ratio_max)
    window = tf.stack([begin[0], begin[1], crop[0], crop[1]])
    return tf.image.decode_and_crop_jpeg(data, window, channels=channels)

  def other(data, seed):
    image = tf.io.decode_image(data, channels=channels, expand_animations=False)
    begin, crop = _sample_crop(tf.shape(image), seed, area_min, area_max, ratio_min, ratio_max)
    return tf.slice(image, begin, crop)

  def apply(data, seed):
    image = tf.cond(tf.io.is_jpeg(data), lambda: jpeg(data, seed), lambda: other(data, seed))
    image.set_shape([None, None, channels])
    return resize_to(image, out_size, method, antialias) if out_size else image

  return apply


@image_op('reshape')
def reshape(new_shape):
  """The value reshaped to `new_shape` (a tuple of ints, -1 for one inferred axis)."""
  if not (isinstance(new_shape, (tuple, list)) and new_shape
          and all(is_int(d) and (d >= 1 or d == -1) for d in new_shape)
          and list(new_shape).count(-1) <= 1):
    raise ValueError(f'new_shape={new_shape!r} must be a tuple of positive ints (one may '
                     'be -1)')
  return lambda image: tf.reshape(image, new_shape)

