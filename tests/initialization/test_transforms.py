"""Transforms: upcycle, zoom_posemb (against the exact bilinear values), reshape."""
import numpy as np
import pytest

from vmoe_sparse_ot.initialization.transforms import TRANSFORMS, reshape, upcycle, zoom_posemb


def test_registry_names():
  assert set(TRANSFORMS) == {'upcycle', 'zoom_posemb', 'reshape'}


def test_upcycle_copies_into_every_expert():
  kernel = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
  out = upcycle(kernel, (4, 3, 5), {})
  assert out.shape == (4, 3, 5) and out.flags.writeable
  for e in range(4):
    np.testing.assert_array_equal(out[e], kernel)
  with pytest.raises(ValueError, match=r'per-expert shape \(3, 6\)'):
    upcycle(kernel, (4, 3, 6), {})


def _linear_posemb(side, d, prefix):
  """Embedding whose channel c at grid cell (y, x) is a_c + b_c y/(side-1) + c_c x/(side-1)."""
  rng = np.random.default_rng(1)
  a, b, c = rng.normal(size=(3, d))
  t = np.linspace(0.0, 1.0, side)
  grid = a + b * t[:, None, None] + c * t[None, :, None]             # (side, side, d)
  cls = rng.normal(size=(prefix, d))
  return np.concatenate([cls, grid.reshape(side * side, d)])[None], (a, b, c), cls


@pytest.mark.parametrize('prefix', [0, 1])
def test_zoom_is_identity_on_the_same_grid(prefix):
  posemb, _, _ = _linear_posemb(4, 6, prefix)
  np.testing.assert_array_equal(zoom_posemb(posemb, posemb.shape, {'num_prefix_tokens': prefix}),
                                posemb)


@pytest.mark.parametrize('old,new', [(4, 7), (7, 4), (3, 12)])
def test_zoom_reproduces_a_linear_embedding_exactly(old, new):
  # Corner-aligned bilinear resizing samples a function that is linear in the grid
  # coordinates exactly at the new grid's points: values computed by hand.
  posemb, (a, b, c), cls = _linear_posemb(old, 5, 1)
  out = zoom_posemb(posemb, (1, 1 + new * new, 5), {'num_prefix_tokens': 1})
  t = np.linspace(0.0, 1.0, new)
  want = (a + b * t[:, None, None] + c * t[None, :, None]).reshape(new * new, 5)
  np.testing.assert_array_equal(out[0, 0], cls[0])   # The class token is kept.
  np.testing.assert_allclose(out[0, 1:], want, atol=1e-12)


def test_zoom_preserves_a_smooth_embedding():
  # A smooth embedding sampled on 14 x 14, zoomed to 24 x 24, against the same
  # function sampled on 24 x 24 (scipy-independent: the function itself).
  def sample(side):
    t = np.linspace(0.0, 1.0, side)
    y, x = np.meshgrid(t, t, indexing='ij')
    chans = [np.sin(np.pi * y), np.cos(2 * x), np.sin(x + y) * np.cos(y)]
    return np.stack(chans, -1).reshape(1, side * side, 3)
  out = zoom_posemb(sample(14), (1, 24 * 24, 3), {'num_prefix_tokens': 0})
  # Bilinear interpolation errs by at most h^2 max|f''| / 8 = pi^2 / (8 * 13^2) = 7.3e-3.
  np.testing.assert_allclose(out, sample(24), atol=1e-2)


def test_zoom_refuses_non_square_grids_and_other_widths():
  with pytest.raises(ValueError, match='not a square grid'):
    zoom_posemb(np.zeros((1, 1 + 12, 4)), (1, 1 + 16, 4), {'num_prefix_tokens': 1})
  with pytest.raises(ValueError, match='same D'):
    zoom_posemb(np.zeros((1, 16, 4)), (1, 16, 8), {})


def test_reshape():
  x = np.arange(12.0)
  np.testing.assert_array_equal(reshape(x, (3, 4), {}), x.reshape(3, 4))
  with pytest.raises(ValueError, match='12 values'):
    reshape(x, (5, 3), {})
