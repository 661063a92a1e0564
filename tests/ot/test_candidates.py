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


def _router_problem(seed, dtype):
  logits = jax.random.normal(jax.random.key(seed), (G, M, N), dtype)
  C = 1.0 - jax.nn.softmax(logits, axis=-1)
  return C, jnp.ones((G, M), dtype), jnp.full((G, N), M / N, dtype)


# Jitted once for the module: compiling dominates these tests.
_full = jax.jit(lambda c, a, b: ot.batched_semi_dual_adam(c, a, b, K, 1.0, 50, 1e-2))
_cand = jax.jit(lambda c, a, b, r: ot.batched_semi_dual_adam_candidates(
    c, a, b, K, 1.0, 50, 1e-2, r), static_argnums=3)


def _both(C, a, b, num_candidates=None):
  return np.asarray(_full(C, a, b)), np.asarray(_cand(C, a, b, num_candidates))


def _primal(T, C):
  return float(np.sum(T * C) + 0.5 * np.sum(T * T))


@pytest.mark.float32
def test_router_plans_match_the_full_path_in_float32():
  assert candidates.applies(K, M, candidates.default_num_candidates(K, M), jnp.float32)
  for seed in (0, 1):
    C, a, b = _router_problem(seed, jnp.float32)
    want, got = _both(C, a, b)
    both, either = np.sum((got > 0) & (want > 0)), np.sum((got > 0) | (want > 0))
    assert both / either >= 0.99
    assert _primal(got, np.asarray(C)) == pytest.approx(_primal(want, np.asarray(C)), rel=1e-5)
    assert ((got > 0).sum(axis=1) <= K).all()


def test_plans_equal_the_full_path_in_float64_with_swaps_and_fallbacks():
  """K + 1 candidates: the swaps run on most steps and often fall back."""
  C, a, b = _router_problem(2, jnp.float64)
  want, got = _both(C, a, b, K + 1)
  np.testing.assert_allclose(got, want, atol=1e-10)
