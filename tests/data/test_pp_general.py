"""data.pp_general: the ops on values and entries, run eagerly, against hand-computed results."""
import numpy as np
import pytest
import tensorflow as tf

from tests.data.pp_helpers import run_pp
from vmoe_sparse_ot.data import pp


def test_value_range_is_the_affine_map_and_clips_on_request():
  image = np.array([[[0, 255, 51]]], np.uint8)
  np.testing.assert_allclose(run_pp('value_range(-1, 1)', image)['image'],
                             [[[-1.0, 1.0, 51 / 255 * 2 - 1]]], rtol=1e-6)
  out = run_pp('value_range(0, 1, in_min=(0, 0, 50), in_max=(255, 510, 100))', image)['image']
  np.testing.assert_allclose(out, [[[0.0, 0.5, 0.02]]], rtol=1e-5, atol=1e-6)
  out = run_pp('value_range(0, 1, in_min=100, in_max=200, clip_values=True)', image)['image']
  np.testing.assert_allclose(out, [[[0.0, 1.0, 0.0]]])
  assert out.dtype == np.float32


def test_onehot_with_smoothing_sums_to_one_and_keeps_the_integer_label():
  k, s = 10, 0.1
  for label in (0, 3, 9):
    out = run_pp(f"onehot({k}, key='label', key_result='labels', on={1 - s + s / k}, "
                 f'off={s / k})', training=False, label=tf.constant(label, tf.int64))
    assert out['label'] == label and out['labels'].shape == (k,)
    np.testing.assert_allclose(out['labels'].sum(), 1.0, rtol=1e-6)
    assert out['labels'].argmax() == label
    np.testing.assert_allclose(out['labels'][label], 1 - s + s / k, rtol=1e-6)
  multi = run_pp('onehot(5)', training=False, labels=tf.constant([1, 3, 3]))['labels']
  np.testing.assert_array_equal(multi, [0, 1, 0, 1, 0])
  rows = run_pp('onehot(5, multi=False)', training=False, labels=tf.constant([1, 3]))['labels']
  np.testing.assert_array_equal(rows, np.eye(5)[[1, 3]])


def test_keep_drop_copy():
  entries = dict(image=tf.zeros([2]), label=tf.constant(1), extra=tf.constant(2))
  assert set(run_pp("keep('image', 'label')", training=False, **entries)) == {'image', 'label'}
  assert set(run_pp("drop('extra', 'nope')", training=False, **entries)) == {'image', 'label'}
  out = run_pp("copy('label', 'target')", training=False, **entries)
  assert out['target'] == out['label'] == 1
  # keep() leaves the per-example seed for the random ops after it.
  run_pp("keep('image')|flip_lr", np.zeros((2, 2, 1), np.uint8))
  with pytest.raises(ValueError, match=r"pp op 'copy' reads entry 'lbl', which the example "
                     r'does not have \(entries: extra, image, label\)'):
    run_pp("copy('lbl', 'x')", training=False, **entries)


def test_flatten_copy_and_ignore_no_labels():
  grid = np.arange(8, dtype=np.uint8).reshape(2, 4, 1)
  flat = pp.build('flatten', training=False)({'image': tf.constant(1),
                                               'objects': {'label': tf.constant(2)}})
  assert sorted(flat) == ['image', 'objects/label']
  copied = run_pp('copy(inkey="label", outkey="target")', training=False,
                  label=tf.constant(7, tf.int64))
  assert int(copied['target']) == 7 and int(copied['label']) == 7
  # An image of ImageNet ReaL without labels does not count; keep() keeps the flag.
  for labels, valid in (([], False), ([3], True), ([1, 5], True)):
    out = run_pp('ignore_no_labels(labels_key="real_label")|keep("image")', training=False,
                 image=grid, real_label=tf.constant(labels, tf.int64))
    assert bool(out[pp.VALID_KEY]) is valid
