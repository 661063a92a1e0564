"""data.pp_image: each image op, run eagerly, against numpy / PIL."""
import numpy as np
import pytest

from tests.data.pp_helpers import PHOTO, RNG, SMOOTH, coords, encode, run_pp
from vmoe_sparse_ot.data import pp


def test_decode_png_and_jpeg_and_channel_conversion():
  grey = RNG.integers(0, 256, (5, 7, 1), dtype=np.uint8)
  np.testing.assert_array_equal(run_pp('decode(channels=1)', encode(grey))['image'], grey)
  np.testing.assert_array_equal(run_pp('decode', encode(grey))['image'],
                                np.repeat(grey, 3, -1))
  np.testing.assert_array_equal(run_pp('decode', encode(PHOTO))['image'], PHOTO)
  jpeg = run_pp('decode', encode(SMOOTH, 'JPEG'))['image']
  assert jpeg.shape == SMOOTH.shape and jpeg.dtype == np.uint8
  # Lossy, but close to the original.
  assert np.abs(jpeg.astype(float) - SMOOTH).mean() < 3


def test_resize_nearest_is_pixel_repetition_and_same_size_is_identity():
  small = RNG.integers(0, 256, (4, 3, 3), dtype=np.uint8)
  out = run_pp("resize((8, 6), method='nearest')", small)['image']
  np.testing.assert_array_equal(out, small.repeat(2, 0).repeat(2, 1))
  np.testing.assert_array_equal(run_pp('resize((24, 40))', PHOTO)['image'], PHOTO)
  out = run_pp('resize(10)', PHOTO)['image']
  assert out.shape == (10, 10, 3) and out.dtype == np.uint8


def test_resize_small_keeps_aspect_ratio_and_area_averages_blocks():
  image = RNG.uniform(0, 1, (16, 32, 1)).astype(np.float32)
  out = run_pp('resize_small(8)', image)['image']
  assert out.shape == (8, 16, 1)
  blocks = image.reshape(8, 2, 16, 2, 1).mean(axis=(1, 3))
  np.testing.assert_allclose(out, blocks, atol=1e-6)
  assert run_pp('resize_small(10)', np.zeros((30, 20, 3), np.uint8))['image'].shape == (15, 10, 3)


def test_central_crop_is_the_middle_window():
  out = run_pp('central_crop((10, 7))', PHOTO)['image']
  np.testing.assert_array_equal(out, PHOTO[7:17, 16:23])
  np.testing.assert_array_equal(run_pp('central_crop', PHOTO)['image'], PHOTO[:, 8:32])


def test_random_crop_is_a_window_at_varying_places():
  image = coords(20, 30)
  offsets = set()
  for seed in range(20):
    out = run_pp('random_crop((5, 8))', image, seed=seed)['image']
    y, x = int(out[0, 0, 0]), int(out[0, 0, 1])
    np.testing.assert_array_equal(out, image[y:y + 5, x:x + 8])
    offsets.add((y, x))
  assert len(offsets) > 10


def test_flip_lr_mirrors_half_the_time_and_is_an_involution():
  flipped = 0
  for seed in range(40):
    out = run_pp('flip_lr', PHOTO, seed=seed)['image']
    is_flipped = np.array_equal(out, PHOTO[:, ::-1])
    assert is_flipped or np.array_equal(out, PHOTO)
    flipped += is_flipped
    # The same seed flips back.
    np.testing.assert_array_equal(run_pp('flip_lr', out, seed=seed)['image'], PHOTO)
  assert 10 <= flipped <= 30


@pytest.mark.parametrize('op,fmt', [
    ('decode|inception_crop(area_min=20, area_max=60)', 'PNG'),
    ('decode_jpeg_and_inception_crop(area_min=20, area_max=60)', 'PNG'),  # Decode, crop.
    ('decode_jpeg_and_inception_crop(area_min=20, area_max=60)', 'JPEG')])  # Fused.
def test_inception_crop_areas_and_ratios_stay_in_range_over_many_draws(op, fmt):
  image = coords(60, 80)
  data = encode(image, fmt)
  fractions, corners = [], set()
  for seed in range(100):
    out = run_pp(op, data, seed=seed)['image']
    h, w, c = out.shape
    fractions.append(h * w / (60 * 80))
    # Aspect ratio in the default [0.75, 1.33], up to the box's integer rounding.
    assert 0.75 * 0.93 <= w / h <= 1.33 * 1.07 and c == 3
    if fmt == 'PNG':
      y, x = int(out[0, 0, 0]), int(out[0, 0, 1])
      np.testing.assert_array_equal(out, image[y:y + h, x:x + w])
      corners.add((y, x))
  fractions = np.array(fractions)
  whole = fractions == 1.0  # The sampler's fallback when no box fits.
  assert whole.mean() < 0.1
  assert fractions[~whole].min() >= 0.2 - 0.03 and fractions[~whole].max() <= 0.6 + 0.03
  assert fractions[~whole].max() - fractions[~whole].min() > 0.2


def test_inception_crop_ratio_range():
  ratios = []
  for seed in range(60):
    out = run_pp('inception_crop(area_min=30, ratio_min=0.5, ratio_max=2.0)', coords(80, 80),
                 seed=seed)['image']
    ratios.append(out.shape[1] / out.shape[0])
  assert min(ratios) >= 0.5 * 0.9 and max(ratios) <= 2.0 * 1.1 and max(ratios) > 1.2


def test_decode_jpeg_and_inception_crop_resizes_and_matches_decode_then_crop():
  jpeg = encode(SMOOTH, 'JPEG')
  out = run_pp('decode_jpeg_and_inception_crop(16)', jpeg, seed=3)['image']
  assert out.shape == (16, 16, 3) and out.dtype == np.uint8
  fused = run_pp('decode_jpeg_and_inception_crop', jpeg, seed=3)['image']
  whole = run_pp('decode', jpeg, training=False)['image']
  h, w, _ = fused.shape
  # The fused op decodes the same pixels as a full decode, cropped somewhere.
  matches = [np.abs(whole[y:y + h, x:x + w].astype(int) - fused).max()
             for y in range(whole.shape[0] - h + 1) for x in range(whole.shape[1] - w + 1)]
  assert min(matches) <= 8


def test_reshape_is_numpy_reshape_and_refuses_a_zero_size():
  grid = np.arange(8, dtype=np.uint8).reshape(2, 4, 1)
  out = run_pp('reshape((4, 2, 1))', image=grid, training=False)
  np.testing.assert_array_equal(out['image'], grid.reshape(4, 2, 1))
  with pytest.raises(pp.PPError, match='new_shape'):
    pp.build('reshape((4, 0))', training=False)
