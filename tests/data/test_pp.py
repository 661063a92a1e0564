"""pp strings: the grammar, one-line errors, and each op against an independent computation."""
import io

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from vmoe_sparse_ot.data import pp
from vmoe_sparse_ot.data.pp_registry import SEED_KEY

IMAGENET21K_TRAIN = ("decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2,20)|value_range(-1,1)|"
                     "onehot(21843,key='label',key_result='labels')|keep('image','labels','label')")


def _run(pp_string, image=None, seed=0, training=True, **entries):
  """Applies `pp_string` eagerly to one example; numpy results."""
  example = dict(entries)
  if image is not None:
    example['image'] = tf.constant(image)
  if training:
    example[SEED_KEY] = tf.constant([7, seed], tf.int64)
  out = pp.build(pp_string, training=training)(example)
  return {k: v.numpy() for k, v in out.items() if k != SEED_KEY}


def _encode(array, fmt='PNG'):
  buffer = io.BytesIO()
  Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(buffer, fmt)
  return buffer.getvalue()


def _coords(h, w):
  """uint8 (h, w, 3) image whose pixel (y, x) is (y, x, 0): a crop tells its offset."""
  y, x = np.meshgrid(np.arange(h), np.arange(w), indexing='ij')
  return np.stack([y, x, np.zeros_like(y)], -1).astype(np.uint8)


RNG = np.random.default_rng(0)
PHOTO = RNG.integers(0, 256, (24, 40, 3), dtype=np.uint8)
# JPEG keeps smooth images nearly intact (noise it does not).
_Y, _X = np.meshgrid(np.arange(48), np.arange(64), indexing='ij')
SMOOTH = np.stack([_Y * 5, _X * 4, 128 + 60 * np.sin(_X / 6.0)], -1).astype(np.uint8)


# Grammar and errors: pure Python, no TensorFlow needed.

def test_parse_reads_literals_and_keeps_bars_inside_strings():
  calls = pp.parse("decode | resize((3, 4), method='area') |keep('a|b', \"c\")|flip_lr")
  assert [(c.name, c.args, c.kwargs) for c in calls] == [
      ('decode', (), {}), ('resize', ((3, 4),), {'method': 'area'}),
      ('keep', ('a|b', 'c'), {}), ('flip_lr', (), {})]
  assert pp.parse('') == () and pp.parse('  ') == ()
  assert pp.is_random('decode|flip_lr') and not pp.is_random('decode|resize(4)')


BAD_PP = [
    ('flipp', "unknown op 'flipp'; ops: central_crop, copy, decode, "),
    ('resize(-1)', "op 'resize(-1)': size=-1 must be a positive integer or a pair (height, "
     "width); accepts resize(size, method='bilinear', antialias=False, key='image', "
     'key_result=None)'),
    ('resize(sise=3)', "op 'resize(sise=3)': missing a required argument: 'size'; accepts "),
    ('resize(4, 5, 6, 7)', "op 'resize(4, 5, 6, 7)': too many positional arguments; accepts "),
    ("resize(4, method='cubic')", "method='cubic' must be one of ['bilinear', "),
    ('inception_crop(area_min=50, area_max=20)', 'must satisfy 0 < area_min <= area_max <= 100'),
    ('onehot(0)', "op 'onehot(0)': depth=0 must be a positive integer (the number of classes); "
     "accepts onehot(depth, key='labels', key_result=None, multi=True, on=1.0, off=0.0)"),
    ("onehot(10, on='x')", "on='x' must be a number"),
    ('value_range(0, 1, in_min=3, in_max=3)', 'in_min=3 and in_max=3 must differ'),
    ('randaug(-1)', 'num_layers=-1 must be an integer >= 0; accepts randaug(num_layers=2, '),
    ('randaug(2, -5)', 'magnitude=-5 must be a number >= 0'),
    ('decode(channels=2)', 'channels=2 must be 1 or 3'),
    ('keep()', 'keys must be one or more entry names'),
    ('central_crop(key=3)', 'key=3 must be the name of an entry'),
    ('resize(x)', "'resize(x)': arguments must be Python literals"),
    ('resize(**{"size": 3})', '* and ** arguments are not allowed'),
    ('decode|', 'not a pp string (invalid syntax'),
    ('decode + resize(3)', "'decode + resize(3)' is not an op"),
    ('os.system("x")', "is not an op"),
]


@pytest.mark.parametrize('string,message', BAD_PP, ids=[s for s, _ in BAD_PP])
def test_bad_strings_fail_in_one_line_naming_the_op(string, message):
  with pytest.raises(pp.PPError) as info:
    pp.build(string, training=True)
  assert message in str(info.value) and '\n' not in str(info.value)


def test_random_ops_are_refused_for_evaluation():
  for op in ('flip_lr', 'random_crop(4)', 'inception_crop', 'randaug(2, 10)',
             'decode_jpeg_and_inception_crop(8)'):
    assert pp.OPS[pp.parse(op)[0].name].random
    with pytest.raises(pp.PPError, match='is random: evaluation preprocessing must be '
                       'deterministic'):
      pp.build(f'decode|{op}', training=False)
  pp.build('decode|resize_small(8)|central_crop(8)|value_range(-1, 1)', training=False)


def test_every_op_the_issue_names_is_registered():
  assert {'decode', 'decode_jpeg_and_inception_crop', 'inception_crop', 'resize',
          'resize_small', 'central_crop', 'random_crop', 'flip_lr', 'value_range', 'randaug',
          'onehot', 'keep', 'copy'} <= set(pp.OPS)


# Ops, eagerly, against numpy / PIL.

def test_decode_png_and_jpeg_and_channel_conversion():
  grey = RNG.integers(0, 256, (5, 7, 1), dtype=np.uint8)
  np.testing.assert_array_equal(_run('decode(channels=1)', _encode(grey))['image'], grey)
  np.testing.assert_array_equal(_run('decode', _encode(grey))['image'],
                                np.repeat(grey, 3, -1))
  np.testing.assert_array_equal(_run('decode', _encode(PHOTO))['image'], PHOTO)
  jpeg = _run('decode', _encode(SMOOTH, 'JPEG'))['image']
  assert jpeg.shape == SMOOTH.shape and jpeg.dtype == np.uint8
  # Lossy, but close to the original.
  assert np.abs(jpeg.astype(float) - SMOOTH).mean() < 3


def test_resize_nearest_is_pixel_repetition_and_same_size_is_identity():
  small = RNG.integers(0, 256, (4, 3, 3), dtype=np.uint8)
  out = _run("resize((8, 6), method='nearest')", small)['image']
  np.testing.assert_array_equal(out, small.repeat(2, 0).repeat(2, 1))
  np.testing.assert_array_equal(_run('resize((24, 40))', PHOTO)['image'], PHOTO)
  out = _run('resize(10)', PHOTO)['image']
  assert out.shape == (10, 10, 3) and out.dtype == np.uint8


def test_resize_small_keeps_aspect_ratio_and_area_averages_blocks():
  image = RNG.uniform(0, 1, (16, 32, 1)).astype(np.float32)
  out = _run('resize_small(8)', image)['image']
  assert out.shape == (8, 16, 1)
  blocks = image.reshape(8, 2, 16, 2, 1).mean(axis=(1, 3))
  np.testing.assert_allclose(out, blocks, atol=1e-6)
  assert _run('resize_small(10)', np.zeros((30, 20, 3), np.uint8))['image'].shape == (15, 10, 3)


def test_central_crop_is_the_middle_window():
  out = _run('central_crop((10, 7))', PHOTO)['image']
  np.testing.assert_array_equal(out, PHOTO[7:17, 16:23])
  np.testing.assert_array_equal(_run('central_crop', PHOTO)['image'], PHOTO[:, 8:32])


def test_random_crop_is_a_window_at_varying_places():
  image = _coords(20, 30)
  offsets = set()
  for seed in range(20):
    out = _run('random_crop((5, 8))', image, seed=seed)['image']
    y, x = int(out[0, 0, 0]), int(out[0, 0, 1])
    np.testing.assert_array_equal(out, image[y:y + 5, x:x + 8])
    offsets.add((y, x))
  assert len(offsets) > 10


def test_flip_lr_mirrors_half_the_time_and_is_an_involution():
  flipped = 0
  for seed in range(40):
    out = _run('flip_lr', PHOTO, seed=seed)['image']
    is_flipped = np.array_equal(out, PHOTO[:, ::-1])
    assert is_flipped or np.array_equal(out, PHOTO)
    flipped += is_flipped
    # The same seed flips back.
    np.testing.assert_array_equal(_run('flip_lr', out, seed=seed)['image'], PHOTO)
  assert 10 <= flipped <= 30


@pytest.mark.parametrize('op,fmt', [
    ('decode|inception_crop(area_min=20, area_max=60)', 'PNG'),
    ('decode_jpeg_and_inception_crop(area_min=20, area_max=60)', 'PNG'),  # Decode, crop.
    ('decode_jpeg_and_inception_crop(area_min=20, area_max=60)', 'JPEG')])  # Fused.
def test_inception_crop_areas_and_ratios_stay_in_range_over_many_draws(op, fmt):
  image = _coords(60, 80)
  data = _encode(image, fmt)
  fractions, corners = [], set()
  for seed in range(100):
    out = _run(op, data, seed=seed)['image']
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
    out = _run('inception_crop(area_min=30, ratio_min=0.5, ratio_max=2.0)', _coords(80, 80),
               seed=seed)['image']
    ratios.append(out.shape[1] / out.shape[0])
  assert min(ratios) >= 0.5 * 0.9 and max(ratios) <= 2.0 * 1.1 and max(ratios) > 1.2


def test_decode_jpeg_and_inception_crop_resizes_and_matches_decode_then_crop():
  jpeg = _encode(SMOOTH, 'JPEG')
  out = _run('decode_jpeg_and_inception_crop(16)', jpeg, seed=3)['image']
  assert out.shape == (16, 16, 3) and out.dtype == np.uint8
  fused = _run('decode_jpeg_and_inception_crop', jpeg, seed=3)['image']
  whole = _run('decode', jpeg, training=False)['image']
  h, w, _ = fused.shape
  # The fused op decodes the same pixels as a full decode, cropped somewhere.
  matches = [np.abs(whole[y:y + h, x:x + w].astype(int) - fused).max()
             for y in range(whole.shape[0] - h + 1) for x in range(whole.shape[1] - w + 1)]
  assert min(matches) <= 8


def test_value_range_is_the_affine_map_and_clips_on_request():
  image = np.array([[[0, 255, 51]]], np.uint8)
  np.testing.assert_allclose(_run('value_range(-1, 1)', image)['image'],
                             [[[-1.0, 1.0, 51 / 255 * 2 - 1]]], rtol=1e-6)
  out = _run('value_range(0, 1, in_min=(0, 0, 50), in_max=(255, 510, 100))', image)['image']
  np.testing.assert_allclose(out, [[[0.0, 0.5, 0.02]]], rtol=1e-5, atol=1e-6)
  out = _run('value_range(0, 1, in_min=100, in_max=200, clip_values=True)', image)['image']
  np.testing.assert_allclose(out, [[[0.0, 1.0, 0.0]]])
  assert out.dtype == np.float32


def test_onehot_with_smoothing_sums_to_one_and_keeps_the_integer_label():
  k, s = 10, 0.1
  for label in (0, 3, 9):
    out = _run(f"onehot({k}, key='label', key_result='labels', on={1 - s + s / k}, "
               f'off={s / k})', training=False, label=tf.constant(label, tf.int64))
    assert out['label'] == label and out['labels'].shape == (k,)
    np.testing.assert_allclose(out['labels'].sum(), 1.0, rtol=1e-6)
    assert out['labels'].argmax() == label
    np.testing.assert_allclose(out['labels'][label], 1 - s + s / k, rtol=1e-6)
  multi = _run('onehot(5)', training=False, labels=tf.constant([1, 3, 3]))['labels']
  np.testing.assert_array_equal(multi, [0, 1, 0, 1, 0])
  rows = _run('onehot(5, multi=False)', training=False, labels=tf.constant([1, 3]))['labels']
  np.testing.assert_array_equal(rows, np.eye(5)[[1, 3]])


def test_keep_drop_copy():
  entries = dict(image=tf.zeros([2]), label=tf.constant(1), extra=tf.constant(2))
  assert set(_run("keep('image', 'label')", training=False, **entries)) == {'image', 'label'}
  assert set(_run("drop('extra', 'nope')", training=False, **entries)) == {'image', 'label'}
  out = _run("copy('label', 'target')", training=False, **entries)
  assert out['target'] == out['label'] == 1
  # keep() leaves the per-example seed for the random ops after it.
  _run("keep('image')|flip_lr", np.zeros((2, 2, 1), np.uint8))
  with pytest.raises(ValueError, match=r"pp op 'copy' reads entry 'lbl', which the example "
                     r'does not have \(entries: extra, image, label\)'):
    _run("copy('lbl', 'x')", training=False, **entries)


def test_imagenet21k_train_string_gives_the_model_input_and_is_seeded():
  # Eager here (tracing RandAugment's 16 branches takes seconds); test_randaug and
  # test_pipeline run ops inside tf.data.
  jpeg = _encode(SMOOTH, 'JPEG')
  first, again, other = [_run(IMAGENET21K_TRAIN, jpeg, seed=seed, label=tf.constant(5, tf.int64))
                         for seed in (0, 0, 1)]
  for out in (first, other):
    assert out['image'].shape == (224, 224, 3) and out['image'].dtype == np.float32
    assert -1 <= out['image'].min() and out['image'].max() <= 1
    assert out['labels'].shape == (21843,) and out['labels'][5] == 1 and out['label'] == 5
  np.testing.assert_array_equal(first['image'], again['image'])
  assert not np.array_equal(first['image'], other['image'])


def test_reference_pp_strings_verbatim_with_its_argument_names():
  """The reference code's spelling: inkey / outkey, resize_size / resize_method."""
  image = _coords(8, 4)
  # Its ImageNet evaluation string, as its configs write it (double quotes included).
  out = _run('decode|resize(resize_size=4, resize_method="nearest")|value_range(-1, 1)|'
             'onehot(5, inkey="label", outkey="labels")|keep("image", "labels")',
             training=False, image=_encode(image), label=tf.constant(3, tf.int64))
  assert sorted(out) == ['image', 'labels']
  ours = _run("decode|resize(4, method='nearest')|value_range(-1, 1)", training=False,
              image=_encode(image))
  np.testing.assert_array_equal(out['image'], ours['image'])
  np.testing.assert_array_equal(out['labels'], [0, 0, 0, 1, 0])
  # onehot(..., key=) reads and writes one entry, as `key` does there.
  same = _run('onehot(3, key="label", on=0.9, off=0.05)', training=False,
              label=tf.constant(1, tf.int64))
  np.testing.assert_allclose(same['label'], [0.05, 0.9, 0.05])
  # Multi-label data (ImageNet ReaL) becomes one multi-hot vector.
  multi = _run('onehot(4, inkey="real_label", outkey="labels")', training=False,
               real_label=tf.constant([0, 2], tf.int64))
  np.testing.assert_array_equal(multi['labels'], [1, 0, 1, 0])
  with pytest.raises(pp.PPError, match='inkey= and key= name the same argument'):
    pp.build('onehot(3, inkey="label", key="label")', training=False)


def test_reshape_flatten_copy_and_ignore_no_labels():
  grid = np.arange(8, dtype=np.uint8).reshape(2, 4, 1)
  out = _run('reshape((4, 2, 1))', image=grid, training=False)
  np.testing.assert_array_equal(out['image'], grid.reshape(4, 2, 1))
  flat = pp.build('flatten', training=False)({'image': tf.constant(1),
                                               'objects': {'label': tf.constant(2)}})
  assert sorted(flat) == ['image', 'objects/label']
  copied = _run('copy(inkey="label", outkey="target")', training=False,
                label=tf.constant(7, tf.int64))
  assert int(copied['target']) == 7 and int(copied['label']) == 7
  # An image of ImageNet ReaL without labels does not count; keep() keeps the flag.
  for labels, valid in (([], False), ([3], True), ([1, 5], True)):
    out = _run('ignore_no_labels(labels_key="real_label")|keep("image")', training=False,
               image=grid, real_label=tf.constant(labels, tf.int64))
    assert bool(out[pp.VALID_KEY]) is valid
  with pytest.raises(pp.PPError, match='new_shape'):
    pp.build('reshape((4, 0))', training=False)
