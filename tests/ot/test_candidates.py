"""The candidate-row batched Adam against the full batched Adam (`ot.batched`).

Router problems: cost 1 - softmax(N(0, 1) logits), one unit of mass per token
(row), m / n per expert (column), at most k tokens per expert. Stated
tolerance: the dispatched (token, expert) pairs agree on at least 99% (both /
either) and the plans' primal objectives <T, C> + gamma / 2 ||T||^2 to 1e-5
relative; in float64 the plans agree to 1e-10.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import candidates

G, M, N, K = 3, 64, 4, 8


def _router_problem(seed, dtype, m=M):
  # (Eager: under jit the fused softmax rounds differently, another problem.)
  logits = jax.random.normal(jax.random.key(seed), (G, m, N), dtype)
  C = 1.0 - jax.nn.softmax(logits, axis=-1)
  # Marginals in numpy: jnp.ones and jnp.full compile a program each.
  return C, jnp.asarray(np.ones((G, m), dtype)), jnp.asarray(np.full((G, N), m / N, dtype))


# Jitted once for the module: compiling dominates these tests.
_full = jax.jit(lambda c, a, b: ot.batched_semi_dual_adam(c, a, b, K, 1.0, 50, 1e-2))
_cand = jax.jit(lambda c, a, b, r: ot.batched_semi_dual_adam_candidates(
    c, a, b, K, 1.0, 50, 1e-2, r), static_argnums=3)
_kth = jax.jit(lambda u, w: candidates._settle_ties(u, candidates._walk(u, w, K), K)[0])


def _both(C, a, b, num_candidates=None):
  return np.asarray(_full(C, a, b)), np.asarray(_cand(C, a, b, num_candidates))


def _primal(T, C):
  return float(np.sum(T * C) + 0.5 * np.sum(T * T))


@pytest.mark.float32
def test_router_plans_match_the_full_path_in_float32():
  assert candidates.applies(K, M, candidates.default_num_candidates(K, M))
  for seed in (0, 1):
    C, a, b = _router_problem(seed, jnp.float32)
    want, got = _both(C, a, b)
    both, either = np.sum((got > 0) & (want > 0)), np.sum((got > 0) | (want > 0))
    assert both / either >= 0.99
    assert _primal(got, np.asarray(C)) == pytest.approx(_primal(want, np.asarray(C)), rel=1e-5)
    assert ((got > 0).sum(axis=1) <= K).all()


def test_plans_equal_the_full_path_in_float64_with_repairs():
  """K + 1 candidates: outside rows enter on most steps (the repair rounds);
  50 rows, not a multiple of the check's blocks of 16 (padding rows)."""
  C, a, b = _router_problem(2, jnp.float64, m=50)
  want, got = _both(C, a, b, K + 1)
  np.testing.assert_allclose(got, want, atol=1e-10)


def test_ties_go_to_the_lower_rows_as_in_the_full_path():
  """Costs on a grid of 1/8: every column has runs of equal values at its
  k-th, so the walk crosses ties (`_settle_ties`) and the members among them
  are chosen by row. Float64: the plans equal the full path's."""
  C, a, b = _router_problem(3, jnp.float64)
  C = jnp.asarray(np.round(np.asarray(C) * 8) / 8)    # numpy: exact, and no compiles
  want, got = _both(C, a, b)
  np.testing.assert_allclose(got, want, atol=1e-10)
  assert ((got > 0).sum(axis=1) <= K).all()


def test_columns_where_k_does_not_bind_take_the_full_path():
  """Masses of 1e-3 per row: a column's mass b_j = 0.016 goes to fewer than k
  rows, so tau has no closed form on the top k and every step takes the full
  path; padding rows (cost 100, no mass) get nothing."""
  C, a, b = _router_problem(4, jnp.float64)
  a, C = np.array(a), np.array(C)                 # numpy: no compiles
  a[:, -5:], C[:, -5:, :] = 0.0, 100.0
  a, C = jnp.asarray(a * 1e-3), jnp.asarray(C)
  # (jnp.sum: np.sum's order rounds b differently.)
  b = jnp.broadcast_to(jnp.sum(a, axis=1, keepdims=True) / N, b.shape)
  want, got = _both(C, a, b)
  assert ((want > 0).sum(axis=1) < K).any()       # k does not bind somewhere
  np.testing.assert_allclose(got, want, atol=1e-12)
  assert not got[:, -5:, :].any()


def test_walk_finds_the_kth_value_from_any_guess():
  """`_walk` then `_settle_ties` against np.sort, from guesses above, below
  and at the answer, with and without ties, several columns at once."""
  rng = np.random.default_rng(0)
  for u in (rng.normal(size=(20, 6)), np.round(rng.normal(size=(20, 6)) * 2) / 2):
    want = -np.sort(-u, axis=0)[K - 1]
    for guess in (np.full(6, np.inf), np.full(6, -np.inf), want, want + 0.3, want - 0.3):
      got = _kth(jnp.asarray(u), jnp.asarray(guess[None]))
      np.testing.assert_array_equal(np.asarray(got)[0], want)
