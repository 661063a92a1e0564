"""ot.batched_semi_dual_adam_pallas (the fused kernel, Pallas interpret mode on the CPU)
equals ot.batched_semi_dual_adam ('fast'): the same iterates up to rounding.

Interpret mode is slow to compile: few, tiny shapes, 10 Adam steps, each case one jit.
"""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import pallas_solve

STEPS, LR = 10, 1e-2


# The kernel's variants: (block_layout, reload_costs, selection).
VARIANTS = [("mn", False, "passes"), ("nm", False, "passes"), ("nm", True, "passes"),
            ("mn", False, "incremental"), ("nm", True, "incremental")]
IDS = ["mn", "nm", "nm-reload", "mn-inc", "nm-reload-inc"]


def _both(C, a, b, k, gamma, variant=VARIANTS[0]):
  """(pallas, fast) plans, one program."""
  layout, reload, selection = variant
  f = jax.jit(lambda C, a, b: (
      ot.batched_semi_dual_adam_pallas(C, a, b, k, gamma, STEPS, LR, block_layout=layout,
                                       reload_costs=reload, selection=selection),
      ot.batched_semi_dual_adam(C, a, b, k, gamma, STEPS, LR)))
  return map(np.asarray, f(C, a, b))


def _router_problem(dtype):
  """3 groups of 12 tokens, 3 experts (both axes padded inside: 16 x 4): group 0
  quantised costs with duplicated tokens (ties at the k-th value), group 1
  random, group 2 random with 3 padding tokens (no mass, cost 100, as the router
  sets them)."""
  rng = np.random.default_rng(0)
  C = rng.uniform(size=(3, 12, 3))
  C[0] = rng.integers(0, 4, size=(12, 3)) / 4.0
  C[0, 6:9] = C[0, 0:3]
  a = np.ones((3, 12))
  C[2, 9:], a[2, 9:] = 100.0, 0.0
  b = a.sum(1, keepdims=True) / 3 * np.ones((3, 3))
  return C.astype(dtype), a.astype(dtype), b.astype(dtype)


def _has_boundary_tie(u, k):
  s = -np.sort(-np.asarray(u), axis=-2)
  return bool((s[..., k - 1, :] == s[..., k, :]).any())


@pytest.mark.float32
@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_matches_fast_in_float32_with_ties_padding_and_groups(variant):
  C, a, b = _router_problem(np.float32)
  k = 4
  assert _has_boundary_tie(-C[0], k)          # at alpha = 0, the first step's u
  got, want = _both(C, a, b, k, 1.0, variant)
  assert got.dtype == np.float32 and got.shape == (3, 12, 3)
  np.testing.assert_allclose(got, want, atol=1e-5)
  np.testing.assert_array_equal(got > 0, want > 0)
  assert ((got > 0).sum(axis=1) <= k).all() and (got[2, 9:] == 0).all()


@pytest.mark.parametrize("variant", VARIANTS, ids=IDS)
def test_matches_fast_in_float64_with_ties_and_k_that_does_not_bind(variant):
  # k = 4 binds; k = 20 > m = 12 does not (the kernel clamps it to m: all rows
  # members, the plain simplex projection, which 'fast' computes without selection).
  # The token choice form's transposed shapes: tests/nn/routers/test_sparse_ot_pallas.py.
  C, a, b = _router_problem(np.float64)
  for k, gamma in ((4, 0.5), (20, 1.0)):
    got, want = _both(C, a, b, k, gamma, variant)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, atol=1e-10)
  # Masses 40x smaller: members without mass (t = 0) in most columns, which the
  # incremental selection's threshold (Michelot's rule) must drop.
  got, want = _both(C, a / 40, b / 40, 4, 0.5, variant)
  assert ((want > 0).sum(axis=1) < 4).mean() > 0.5
  np.testing.assert_allclose(got, want, atol=1e-10)
  np.testing.assert_array_equal(got > 0, want > 0)
  # Wide: 3 rows, 12 columns (m < n, as in the token choice form), padded columns
  # carrying no mass; at most k = 2 of the 3 rows per column.
  wide_C, wide_a, wide_b = np.swapaxes(C, 1, 2), b, a
  got, want = _both(wide_C, wide_a, wide_b, 2, 0.5, variant)
  np.testing.assert_allclose(got, want, atol=1e-10)
  assert ((got > 0).sum(axis=1) <= 2).all() and (got[2, :, 9:] == 0).all()
  assert (got > 0).any(axis=(1, 2)).all()


@pytest.mark.float32
def test_lowers_to_triton_for_a_gpu():
  """Without a GPU: the kernel lowers through Pallas' Triton rules for the 'cuda'
  platform (every primitive it uses has a Triton lowering; block shapes are powers
  of two). Compiling the Triton IR needs a GPU and is not checked here."""
  shape = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  fn = jax.jit(lambda C, a, b: pallas_solve.batched_semi_dual_adam_pallas(
      C, a, b, 3, 1.0, STEPS, LR, interpret=False))
  text = fn.trace(shape(2, 12, 3), shape(2, 12), shape(2, 3)).lower(
      lowering_platforms=("cuda",)).as_text()
  assert "__gpu$xla.gpu.triton" in text and "grid_x = 2" in text
  # 4 warps by default: the fastest measured on an H200 at the B/32 shapes.
  assert "num_warps = 4 :" in text
  # The other variants lower too (the transposed block; costs read at each use; the
  # incremental selection's while loops).
  for layout, reload, selection in VARIANTS[1:]:
    other = jax.jit(lambda C, a, b, lay=layout, rel=reload, sel=selection:
                    pallas_solve.batched_semi_dual_adam_pallas(
                        C, a, b, 3, 1.0, STEPS, LR, interpret=False, block_layout=lay,
                        reload_costs=rel, selection=sel))
    assert "__gpu$xla.gpu.triton" in other.trace(
        shape(2, 12, 3), shape(2, 12), shape(2, 3)).lower(lowering_platforms=("cuda",)).as_text()


def test_refuses_a_warp_count_that_gave_wrong_plans_an_unknown_layout_and_selection():
  C, a, b = _router_problem(np.float32)
  with pytest.raises(ValueError, match=r"num_warps must be one of \(1, 2, 4, 8, 16\), got 32"):
    pallas_solve.batched_semi_dual_adam_pallas(C, a, b, 3, 1.0, STEPS, LR, num_warps=32)
  with pytest.raises(ValueError, match=r"block_layout must be one of \('mn', 'nm'\), got 'mk'"):
    pallas_solve.batched_semi_dual_adam_pallas(C, a, b, 3, 1.0, STEPS, LR, block_layout="mk")
  with pytest.raises(ValueError, match=r"selection must be one of \('passes', 'incremental'\), "
                     r"got 'sort'"):
    pallas_solve.batched_semi_dual_adam_pallas(C, a, b, 3, 1.0, STEPS, LR, selection="sort")
