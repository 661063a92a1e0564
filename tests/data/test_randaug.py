"""RandAugment: each op against PIL or a numpy computation, then the randaug pp op."""
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from PIL import ImageEnhance
from PIL import ImageOps

from vmoe_sparse_ot.data import pp
from vmoe_sparse_ot.data import randaug
from vmoe_sparse_ot.data.pp_registry import SEED_KEY

RNG = np.random.default_rng(0)
NOISE = RNG.integers(0, 256, (20, 24, 3), dtype=np.uint8)
# Smooth with a narrow range: what autocontrast and equalize have something to do on.
_Y, _X = np.meshgrid(np.arange(20), np.arange(24), indexing='ij')
SMOOTH = np.stack([60 + 3 * _Y, 90 + 2 * _X, 100 + _X + _Y], -1).astype(np.uint8)
SEED = tf.constant([1, 2], tf.int64)


def _tf(fn, image, *args):
  return fn(tf.constant(image), *args).numpy()


def _pil(image):
  return Image.fromarray(image)


def _close(got, want, atol):
  """Equal up to `atol` grey levels (float rounding of blends and grey conversion)."""
  assert got.shape == want.shape and got.dtype == np.uint8
  assert np.abs(got.astype(int) - want.astype(int)).max() <= atol


@pytest.mark.parametrize('image', [NOISE, SMOOTH], ids=['noise', 'smooth'])
def test_pixel_ops_equal_pil(image):
  np.testing.assert_array_equal(_tf(randaug.equalize, image), ImageOps.equalize(_pil(image)))
  np.testing.assert_array_equal(_tf(randaug.invert, image), ImageOps.invert(_pil(image)))
  for bits in (1, 4, 8):
    np.testing.assert_array_equal(_tf(randaug.posterize, image, bits),
                                  ImageOps.posterize(_pil(image), bits))
  for threshold in (0, 100, 128, 256):
    np.testing.assert_array_equal(_tf(randaug.solarize, image, threshold),
                                  ImageOps.solarize(_pil(image), threshold))
  _close(_tf(randaug.auto_contrast, image), np.asarray(ImageOps.autocontrast(_pil(image))), 1)


def test_equalize_leaves_a_flat_channel_and_equalizes_the_others():
  image = np.concatenate([NOISE[..., :2], np.full_like(NOISE[..., :1], 9)], -1)
  out = _tf(randaug.equalize, image)
  np.testing.assert_array_equal(out, ImageOps.equalize(_pil(image)))
  np.testing.assert_array_equal(out[..., 2], 9)


def test_auto_contrast_stretches_each_channel_and_keeps_flat_ones():
  image = SMOOTH.copy()
  image[..., 2] = 77
  out = _tf(randaug.auto_contrast, image)
  assert out[..., :2].min(axis=(0, 1)).tolist() == [0, 0]
  assert out[..., :2].max(axis=(0, 1)).tolist() == [255, 255]
  np.testing.assert_array_equal(out[..., 2], 77)
  lo, hi = image[..., 0].min(), image[..., 0].max()
  want = np.floor((image[..., 0].astype(float) - lo) * 255 / (hi - lo) + 1e-6)
  _close(out[..., 0], want.astype(np.uint8), 1)


def test_solarize_add_adds_below_the_threshold_only():
  image = np.array([[[0, 100, 127], [128, 200, 255]]], np.uint8)
  np.testing.assert_array_equal(_tf(randaug.solarize_add, image, 110),
                                [[[110, 210, 237], [128, 200, 255]]])
  np.testing.assert_array_equal(_tf(randaug.solarize_add, image, 200),
                                [[[200, 255, 255], [128, 200, 255]]])


@pytest.mark.parametrize('factor', [0.0, 0.1, 0.5, 1.0, 1.9])
def test_enhance_ops_equal_pil(factor):
  for name, enhancer in (('color', ImageEnhance.Color), ('contrast', ImageEnhance.Contrast),
                         ('brightness', ImageEnhance.Brightness),
                         ('sharpness', ImageEnhance.Sharpness)):
    for image in (NOISE, SMOOTH):
      want = np.asarray(enhancer(_pil(image)).enhance(factor))
      _close(_tf(getattr(randaug, name), image, factor), want, 2)


def test_blend_interpolates_and_extrapolates_with_clipping():
  a = np.array([[[0, 100, 200]]], np.uint8)
  b = np.array([[[100, 100, 100]]], np.uint8)
  np.testing.assert_array_equal(randaug.blend(a, b, 0.5).numpy(), [[[50, 100, 150]]])
  np.testing.assert_array_equal(randaug.blend(a, b, 3.0).numpy(), [[[255, 100, 0]]])


def _np_transform(image, matrix):
  """Output (x, y) <- input (a0 x + a1 y + a2, b0 x + b1 y + b2), nearest, grey outside."""
  a0, a1, a2, b0, b1, b2 = matrix
  h, w, _ = image.shape
  y, x = np.meshgrid(np.arange(h), np.arange(w), indexing='ij')
  xs, ys = a0 * x + a1 * y + a2, b0 * x + b1 * y + b2
  # Round half away from zero, as the TF kernel does.
  xi = (np.sign(xs) * np.floor(np.abs(xs) + 0.5)).astype(int)
  yi = (np.sign(ys) * np.floor(np.abs(ys) + 0.5)).astype(int)
  inside = (xi >= 0) & (xi < w) & (yi >= 0) & (yi < h)
  out = np.full_like(image, 128)
  out[inside] = image[yi[inside], xi[inside]]
  return out


def test_shear_and_translate_equal_the_inverse_mapping():
  # Shears of 0.2 and whole-pixel shifts never land on a rounding tie.
  for level in (0.2, -0.2):
    np.testing.assert_array_equal(_tf(randaug.shear_x, NOISE, level),
                                  _np_transform(NOISE, (1, level, 0, 0, 1, 0)))
    np.testing.assert_array_equal(_tf(randaug.shear_y, NOISE, level),
                                  _np_transform(NOISE, (1, 0, 0, level, 1, 0)))
  for pixels in (5.0, -7.0):
    out = _tf(randaug.translate_x, NOISE, pixels)
    np.testing.assert_array_equal(out, _np_transform(NOISE, (1, 0, pixels, 0, 1, 0)))
    out = _tf(randaug.translate_y, NOISE, pixels)
    np.testing.assert_array_equal(out, _np_transform(NOISE, (1, 0, 0, 0, 1, pixels)))
  # Content moves left by 5: column 0 shows input column 5, the last 5 are grey.
  out = _tf(randaug.translate_x, NOISE, 5.0)
  np.testing.assert_array_equal(out[:, :-5], NOISE[:, 5:])
  assert (out[:, -5:] == 128).all()


def test_rotate_about_the_centre():
  square = NOISE[:, :20]
  np.testing.assert_array_equal(_tf(randaug.rotate, square, 90.0), np.rot90(square))
  np.testing.assert_array_equal(_tf(randaug.rotate, square, 0.0), square)
  theta = np.deg2rad(30.0)
  c, s, cy, cx = np.cos(theta), np.sin(theta), (20 - 1) / 2, (24 - 1) / 2
  want = _np_transform(NOISE, (c, -s, cx - c * cx + s * cy, s, c, cy - s * cx - c * cy))
  got = _tf(randaug.rotate, NOISE, 30.0)
  # Float32 against float64 coordinates: a rare pixel rounds the other way.
  assert (got == want).all(axis=-1).mean() > 0.98


def test_cutout_greys_one_square_at_varying_places():
  image = np.zeros((20, 24, 3), np.uint8) + 7
  centres = set()
  for seed in range(12):
    out = randaug.cutout(tf.constant(image), 3, tf.constant([0, seed])).numpy()
    ys, xs = np.nonzero((out != image).any(-1))
    assert (out[ys, xs] == 128).all() and len(ys) > 0
    # One axis-aligned box of side at most 6 (cut by the border), all of it grey.
    h, w = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
    assert h <= 6 and w <= 6 and len(ys) == h * w
    centres.add((ys.min(), xs.min()))
  assert len(centres) > 6


def test_level_to_argument_mapping_follows_the_reference():
  names = [name for name, _ in randaug.layer_ops(10, 100, 40)]
  assert names == ['AutoContrast', 'Equalize', 'Invert', 'Rotate', 'Posterize', 'Solarize',
                   'Color', 'Contrast', 'Brightness', 'Sharpness', 'ShearX', 'ShearY',
                   'TranslateX', 'TranslateY', 'Cutout', 'SolarizeAdd']
  ops = dict(randaug.layer_ops(5, 8, 40))  # M = 5: half the maximum level.
  image = tf.constant(NOISE)
  np.testing.assert_array_equal(ops['Posterize'](image, SEED), ImageOps.posterize(
      _pil(NOISE), 2))
  np.testing.assert_array_equal(ops['Solarize'](image, SEED), ImageOps.solarize(
      _pil(NOISE), 128))
  np.testing.assert_array_equal(ops['SolarizeAdd'](image, SEED),
                                randaug.solarize_add(image, 55))
  np.testing.assert_array_equal(ops['Brightness'](image, SEED), randaug.brightness(image, 1.0))
  shifted = ops['TranslateX'](image, SEED).numpy()  # 4 pixels, either way.
  assert any(np.array_equal(shifted, _tf(randaug.translate_x, NOISE, p)) for p in (4.0, -4.0))


def _randaug(image, seed, layers=2, magnitude=10):
  fn = pp.build(f'randaug({layers}, {magnitude})', training=True)
  return fn({'image': tf.constant(image), SEED_KEY: tf.constant([3, seed], tf.int64)})['image']


def test_randaug_keeps_shape_and_dtype_changes_pixels_and_is_seeded():
  changed = 0
  for seed in range(10):
    out = _randaug(NOISE, seed).numpy()
    assert out.shape == NOISE.shape and out.dtype == np.uint8
    changed += not np.array_equal(out, NOISE)
    np.testing.assert_array_equal(out, _randaug(NOISE, seed))
  assert changed >= 8
  grey = NOISE[..., :1]
  out = _randaug(grey, 0, layers=3)
  assert out.shape == grey.shape and out.dtype == tf.uint8
  np.testing.assert_array_equal(_randaug(NOISE, 0, layers=0), NOISE)
  with pytest.raises(ValueError, match='randaug needs uint8 images.*before value_range'):
    _randaug(NOISE.astype(np.float32), 0)


def test_randaug_runs_as_a_graph():
  # As tf.data traces it (without autograph, as the pipeline maps it): every op and
  # the choice among them are graph ops. One layer: tracing 16 branches takes ~1 s.
  fn = tf.function(pp.build('randaug(1, 10)|value_range(-1, 1)', training=True),
                   autograph=False)
  out = [fn({'image': tf.constant(NOISE[:8, :8]), SEED_KEY: tf.constant([0, i], tf.int64)})
         ['image'].numpy() for i in range(4)]
  assert all(o.shape == (8, 8, 3) and o.dtype == np.float32 for o in out)
  assert len({o.tobytes() for o in out}) > 1
