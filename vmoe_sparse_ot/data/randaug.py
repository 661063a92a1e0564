"""RandAugment in TensorFlow: `randaug(num_layers, magnitude)` and its 16 image ops.

RandAugment (Cubuk et al. 2019) applies `num_layers` ops in a row, each drawn
uniformly from a fixed list, all at one shared `magnitude` M. The list, and how M
maps to each op's argument, are those of the reference V-MoE / big_vision
RandAugment (M is on a scale where 10 is the "maximum level", and the reference
recipes use M up to 20):

  AutoContrast, Equalize, Invert         no argument
  Rotate        M/10 * 30 degrees, random sign
  Posterize     keep int(M/10 * 4) bits (clamped to 0..8; 8 keeps the image)
  Solarize      invert pixels >= int(M/10 * 256) (M >= 10: nothing is)
  Color, Contrast, Brightness, Sharpness   blend factor M/10 * 1.8 + 0.1
  ShearX/Y      M/10 * 0.3, random sign
  TranslateX/Y  M/10 * translate_const pixels (100), random sign
  Cutout        a square of side 2 * int(M/10 * cutout_const) (40) at a random place
  SolarizeAdd   add int(M/10 * 110) to pixels < 128

Empty pixels after a geometric op are grey (128). Ops are the PIL operations of
the same names on uint8 RGB images, written as graph ops (they run inside
tf.data's map) with randomness from stateless seeds. One difference from the
reference: Contrast blends towards the image's mean grey level as PIL does (the
reference used the pixel count / 256 instead of the mean).

Grey (H, W, 1) images are augmented as RGB with equal channels, then returned with
one channel (every op keeps equal channels equal).
"""
from __future__ import annotations

import math
import numbers

from vmoe_sparse_ot.data.pp_registry import image_op
from vmoe_sparse_ot.data.pp_registry import tf

MAX_LEVEL = 10.0
REPLACE = 128  # Fill value of pixels that a geometric op leaves empty.


def blend(image1, image2, factor):
  """image1 + factor * (image2 - image1), clipped to 0..255, as uint8 (truncated).

  factor 0 gives image1, 1 gives image2; above 1 extrapolates away from image1.
  """
  a = tf.cast(image1, tf.float32)
  b = tf.cast(image2, tf.float32)
  return tf.cast(tf.clip_by_value(a + factor * (b - a), 0.0, 255.0), tf.uint8)


def _grey(image):
  """uint8 (H, W, 3) -> its luminance (ITU-R 601-2, as PIL's 'L'), uint8 (H, W, 1)."""
  return tf.image.rgb_to_grayscale(image)


def auto_contrast(image):
  """Stretches each channel to span 0..255 (channels with one value are kept)."""
  x = tf.cast(image, tf.float32)
  lo = tf.reduce_min(x, axis=(0, 1), keepdims=True)
  hi = tf.reduce_max(x, axis=(0, 1), keepdims=True)
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  stretched = tf.cast(tf.clip_by_value((x - lo) * scale, 0.0, 255.0), tf.uint8)
  return tf.where(hi > lo, stretched, image)


def equalize(image):
  """Histogram equalization of each channel, as PIL's ImageOps.equalize.

  All channels at once (no tf.cond per channel): channel c's values are offset by
  256 c, so one bincount gives every histogram and one gather applies every table.
  """
  channels = image.shape[-1]
  offsets = tf.range(channels) * 256
  values = tf.cast(image, tf.int32) + offsets
  hist = tf.reshape(tf.math.bincount(tf.reshape(values, [-1]), minlength=256 * channels,
                                     maxlength=256 * channels), [channels, 256])
  # PIL leaves the count of the brightest value present out of the step.
  brightest = 255 - tf.argmax(tf.cast(tf.reverse(hist, [1]) > 0, tf.int32), axis=1,
                              output_type=tf.int32)
  step = (tf.reduce_sum(hist, 1) - tf.gather(hist, brightest, batch_dims=1)) // 255
  lut = (tf.cumsum(hist, axis=1) + step[:, None] // 2) // tf.maximum(step, 1)[:, None]
  lut = tf.clip_by_value(tf.concat([tf.zeros([channels, 1], tf.int32), lut[:, :-1]], 1), 0, 255)
  # A channel with (almost) one value has step 0: PIL leaves it as it is.
  lut = tf.where(step[:, None] > 0, lut, tf.range(256)[None, :])
  return tf.cast(tf.gather(tf.reshape(lut, [-1]), values), tf.uint8)


def invert(image):
  """255 - image."""
  return 255 - image


def posterize(image, bits: int):
  """Keeps the `bits` most significant bits of each pixel."""
  shift = 8 - min(max(int(bits), 0), 8)
  return tf.bitwise.left_shift(tf.bitwise.right_shift(image, shift), shift)


def solarize(image, threshold):
  """Inverts the pixels >= threshold."""
  return tf.where(tf.cast(image, tf.int32) < threshold, image, 255 - image)


def solarize_add(image, addition, threshold=128):
  """Adds `addition` (clipped to 0..255) to the pixels < threshold."""
  added = tf.clip_by_value(tf.cast(image, tf.int32) + addition, 0, 255)
  return tf.where(tf.cast(image, tf.int32) < threshold, tf.cast(added, tf.uint8), image)


def color(image, factor):
  """PIL's Color: blend from the grey image (factor 0) to the image (1)."""
  return blend(tf.image.grayscale_to_rgb(_grey(image)), image, factor)


def contrast(image, factor):
  """PIL's Contrast: blend from the image's rounded mean grey level (0) to the image (1)."""
  mean = tf.floor(tf.reduce_mean(tf.cast(_grey(image), tf.float32)) + 0.5)
  return blend(tf.fill(tf.shape(image), mean), image, factor)


def brightness(image, factor):
  """PIL's Brightness: blend from black (factor 0) to the image (1)."""
  return blend(tf.zeros_like(image), image, factor)


def sharpness(image, factor):
  """PIL's Sharpness: blend from the image smoothed by PIL's 3x3 SMOOTH filter (border
  pixels kept) (factor 0) to the image (1)."""
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13.0
  channels = image.shape[-1]
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, channels, 1])
  smooth = tf.nn.depthwise_conv2d(tf.cast(image, tf.float32)[None], kernel,
                                  strides=[1, 1, 1, 1], padding='VALID')[0]
  smooth = tf.cast(tf.clip_by_value(tf.round(smooth), 0.0, 255.0), tf.uint8)
  inner = tf.pad(tf.ones_like(smooth, tf.bool), [[1, 1], [1, 1], [0, 0]])
  degenerate = tf.where(inner, tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), image)
  return blend(degenerate, image, factor)


def transform(image, matrix):
  """Output pixel (x, y) takes input pixel round(a0 x + a1 y + a2, b0 x + b1 y + b2),
  `matrix` = [a0, a1, a2, b0, b1, b2]; outside the image: grey (REPLACE)."""
  matrix = tf.concat([tf.cast(tf.stack(matrix), tf.float32), tf.zeros([2])], 0)
  out = tf.raw_ops.ImageProjectiveTransformV3(
      images=image[None], transforms=matrix[None], output_shape=tf.shape(image)[:2],
      fill_value=float(REPLACE), interpolation='NEAREST', fill_mode='CONSTANT')
  return tf.ensure_shape(out[0], image.shape)


def rotate(image, degrees):
  """Rotates by `degrees` counterclockwise about the image centre."""
  radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  cos, sin = tf.cos(radians), tf.sin(radians)
  shape = tf.cast(tf.shape(image), tf.float32)
  cy, cx = (shape[0] - 1) / 2, (shape[1] - 1) / 2
  return transform(image, [cos, -sin, cx - cos * cx + sin * cy,
                           sin, cos, cy - sin * cx - cos * cy])


def shear_x(image, level):
  """Output (x, y) <- input (x + level * y, y)."""
  return transform(image, [1.0, level, 0.0, 0.0, 1.0, 0.0])


def shear_y(image, level):
  """Output (x, y) <- input (x, y + level * x)."""
  return transform(image, [1.0, 0.0, 0.0, level, 1.0, 0.0])


def translate_x(image, pixels):
  """Output (x, y) <- input (x + pixels, y): the content moves left by `pixels`."""
  return transform(image, [1.0, 0.0, pixels, 0.0, 1.0, 0.0])


def translate_y(image, pixels):
  """Output (x, y) <- input (x, y + pixels): the content moves up by `pixels`."""
  return transform(image, [1.0, 0.0, 0.0, 0.0, 1.0, pixels])


def cutout(image, pad_size: int, seed):
  """Greys (REPLACE) the pixels within `pad_size` (Chebyshev, half-open) of a uniformly
  drawn pixel: a square of side 2 * pad_size, cut by the image border."""
  shape = tf.shape(image)
  centre = tf.random.stateless_uniform([2], seed, minval=0, maxval=tf.int32.max,
                                       dtype=tf.int32) % shape[:2]
  rows = tf.range(shape[0])[:, None, None]
  cols = tf.range(shape[1])[None, :, None]
  inside = ((rows >= centre[0] - pad_size) & (rows < centre[0] + pad_size)
            & (cols >= centre[1] - pad_size) & (cols < centre[1] + pad_size))
  return tf.where(inside, tf.cast(REPLACE, image.dtype), image)


def _random_sign(value, seed):
  sign = tf.where(tf.random.stateless_uniform([], seed) < 0.5, -1.0, 1.0)
  return sign * value


def layer_ops(magnitude: float, translate_const: float, cutout_const: float):
  """The 16 ops at `magnitude`, as (name, f(uint8 RGB image, seed) -> image)."""
  level = magnitude / MAX_LEVEL
  enhance = level * 1.8 + 0.1
  return (
      ('AutoContrast', lambda x, s: auto_contrast(x)),
      ('Equalize', lambda x, s: equalize(x)),
      ('Invert', lambda x, s: invert(x)),
      ('Rotate', lambda x, s: rotate(x, _random_sign(level * 30.0, s))),
      ('Posterize', lambda x, s: posterize(x, int(level * 4))),
      ('Solarize', lambda x, s: solarize(x, int(level * 256))),
      ('Color', lambda x, s: color(x, enhance)),
      ('Contrast', lambda x, s: contrast(x, enhance)),
      ('Brightness', lambda x, s: brightness(x, enhance)),
      ('Sharpness', lambda x, s: sharpness(x, enhance)),
      ('ShearX', lambda x, s: shear_x(x, _random_sign(level * 0.3, s))),
      ('ShearY', lambda x, s: shear_y(x, _random_sign(level * 0.3, s))),
      ('TranslateX', lambda x, s: translate_x(x, _random_sign(level * translate_const, s))),
      ('TranslateY', lambda x, s: translate_y(x, _random_sign(level * translate_const, s))),
      ('Cutout', lambda x, s: cutout(x, int(level * cutout_const), s)),
      ('SolarizeAdd', lambda x, s: solarize_add(x, int(level * 110))),
  )


def distort(image, seed, num_layers: int, magnitude: float, translate_const: float = 100,
            cutout_const: float = 40):
  """RandAugment of a uint8 (H, W, 1 or 3) image with stateless `seed`."""
  if image.dtype != tf.uint8:
    raise ValueError(f'randaug needs uint8 images (0..255), got {image.dtype.name}: '
                     'put it before value_range')
  if image.shape.rank != 3 or image.shape[-1] not in (1, 3):
    raise ValueError(f'randaug needs (H, W, 1 or 3) images, got shape {image.shape}')
  grey = image.shape[-1] == 1
  x = tf.image.grayscale_to_rgb(image) if grey else image
  ops = layer_ops(magnitude, translate_const, cutout_const)
  for layer_seed in tf.unstack(tf.random.experimental.stateless_split(seed, num_layers)):
    choice_seed, op_seed = tf.unstack(tf.random.experimental.stateless_split(layer_seed, 2))
    index = tf.random.stateless_uniform([], choice_seed, 0, len(ops), dtype=tf.int32)
    # Bind x and op_seed now: the branches run inside switch_case.
    branches = [lambda f=f, x=x, s=op_seed: tf.ensure_shape(f(x, s), x.shape) for _, f in ops]
    x = tf.switch_case(index, branches)
  return x[..., :1] if grey else x


def _number(name: str, value, minimum: float) -> None:
  if not isinstance(value, numbers.Real) or isinstance(value, bool) or value < minimum:
    raise ValueError(f'{name}={value!r} must be a number >= {minimum:g}')


@image_op('randaug', random=True)
def randaug(num_layers=2, magnitude=10, translate_const=100, cutout_const=40):
  """RandAugment: `num_layers` ops drawn from 16, each at `magnitude` (uint8 images)."""
  if not (isinstance(num_layers, int) and not isinstance(num_layers, bool) and num_layers >= 0):
    raise ValueError(f'num_layers={num_layers!r} must be an integer >= 0')
  _number('magnitude', magnitude, 0)
  _number('translate_const', translate_const, 0)
  _number('cutout_const', cutout_const, 0)

  def apply(image, seed):
    if num_layers == 0:
      return image
    return distort(image, seed, num_layers, float(magnitude), float(translate_const),
                   float(cutout_const))

  return apply
