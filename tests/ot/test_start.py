"""The semi-dual's default start, `ot.c_transform_start`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import problem
from vmoe_sparse_ot import ot

# Jitted (the regularizer a pytree argument, gamma a traced leaf): one program
# per shape and regularizer type instead of one per primitive eagerly.
c_transform_start = jax.jit(ot.c_transform_start)


def _soft_min(C, b, eps):
  """-eps log sum_j (b_j / sum b) exp(-C_ij / eps), in float64 numpy, shifted."""
  w = b / b.sum()
  lo = C.min(axis=1, keepdims=True)
  with np.errstate(divide="ignore"):
    return lo[:, 0] - eps * np.log(np.sum(w * np.exp(-(C - lo) / eps), axis=1))


def _eps(scale, C):
  """A tenth of the regularizer's cost scale, at most of the mean row spread of C."""
  return min(scale, np.mean(C.max(1) - C.min(1))) / 10


@pytest.mark.parametrize("reg, scale_of_b", [
    (ot.SparsityConstrained(k=2, gamma=0.5), lambda b: 0.5 * b.mean()),
    (ot.SquaredL2(2.0), lambda b: 2.0 * b.mean()),
    (ot.SquaredL2(2.0), lambda b: 2.0 * b.mean()),
    (ot.NegEntropy(0.3), lambda b: 0.3),
    (ot.NegEntropy(30.0), lambda b: 30.0)],
    ids=["sparse", "l2", "l2_capped", "entropic", "entropic_capped"])
def test_start_is_the_soft_minimum_over_columns_with_mass(reg, scale_of_b, request):
  a, b, C = problem(7, 5, seed=3, uniform=False)
  C = C - 0.4                                     # any sign
  if "capped" in request.node.callspec.id:
    b = b * 100                                   # gamma mean(b) above the costs' spread
  eps = _eps(scale_of_b(b), C)
  assert (eps < scale_of_b(b) / 10) == ("capped" in request.node.callspec.id)
  alpha = np.asarray(c_transform_start(jnp.asarray(b), jnp.asarray(C), reg))
  np.testing.assert_allclose(alpha, _soft_min(C, b, eps), rtol=1e-12, atol=1e-15)
  # Between the hard minimum and the hard minimum + eps log(sum b / min b).
  assert (alpha >= C.min(1) - 1e-15).all()
  assert (alpha <= C.min(1) + eps * np.log(b.sum() / b.min()) + 1e-15).all()
  # A column without mass plays no part, however cheap.
  b0, C0 = np.append(b, 0.0), np.concatenate([C, np.full((7, 1), -50.0)], axis=1)
  alpha0 = c_transform_start(jnp.asarray(b0), jnp.asarray(C0), reg)
  np.testing.assert_allclose(np.asarray(alpha0), alpha, rtol=1e-12)


def test_no_mass_at_all_starts_at_zero():
  C = jnp.asarray(np.random.RandomState(0).rand(4, 3))
  alpha = c_transform_start(jnp.zeros(3), C, ot.SquaredL2(1.0))
  np.testing.assert_array_equal(np.asarray(alpha), 0.0)


@pytest.mark.parametrize("seed", [0, 1])
def test_default_start_reaches_the_optimum_where_the_hard_minimum_has_a_kink(seed):
  """k = 5 with ~75 rows per best column: from alpha_i = min_j C_ij those rows
  tie at 0 at the top of their column, the objective has a kink at the start
  and L-BFGS finds no ascent from it; the soft minimum does not tie them."""
  a, b, C = problem(600, 8, seed=seed)
  reg = ot.SparsityConstrained(k=5, gamma=0.1)
  soft = ot.solve(a, b, C, reg, max_iter=400)
  ref = ot.solve(a, b, C, reg, init=np.zeros(600), max_iter=4000)
  assert float(soft.value) >= float(ref.value) - 1e-6 * abs(float(ref.value))
  # Why not the hard minimum (documents the failure the soft one avoids),
  # even with the reference's budget (and its compiled solver):
  hard = ot.solve(a, b, C, reg, init=C.min(1), max_iter=4000)
  assert float(hard.value) < float(ref.value) - 1e-3 * abs(float(ref.value))


@pytest.mark.parametrize("seed", [1, 2])
def test_default_start_needs_fewer_iterations_than_zero(seed):
  """Large k (k ~ 1.15 m / n, the MNIST clustering ratio): iterations to reach
  1e-6 of the optimum (measured: 0.38x to 0.65x of the zero start's here and
  at 1000 x 10 with k = 115, a size dropped as the same case)."""
  m, n, k = 600, 8, 87
  a, b, C = problem(m, n, seed=seed)
  reg = ot.SparsityConstrained(k=k, gamma=0.1)
  best = float(ot.solve(a, b, C, reg, init=np.zeros(m), max_iter=5000,
                        solver=ot.LBFGS(rtol=1e-13)).value)
  target = best - 1e-6 * abs(best)

  def iterations_to_target(init):
    trace = ot.solve(a, b, C, reg, init=init, trace=True, max_iter=2000).trace
    hits = np.flatnonzero(np.asarray(trace.value) >= target)
    assert hits.size, f"init {init is None and 'default' or 'zero'} never reached 1e-6"
    return int(hits[0]) + 1
  assert iterations_to_target(None) < 0.8 * iterations_to_target(np.zeros(m))


def test_default_start_is_traceable_under_vmap():
  a, b, C = problem(30, 6, seed=4)
  reg = ot.SparsityConstrained(k=8, gamma=0.2)
  # (Stacked and indexed in numpy: eagerly each would compile a program.)
  Cs = np.stack([C, C ** 2])
  out = np.asarray(jax.vmap(lambda c: ot.solve(a, b, c, reg, max_iter=30, tol=0.0).alpha)(Cs))
  for i in range(2):
    single = ot.solve(a, b, Cs[i], reg, max_iter=30, tol=0.0).alpha
    np.testing.assert_allclose(out[i], np.asarray(single), rtol=1e-9, atol=1e-12)
  # gamma traced: eps follows it.
  gammas = jnp.asarray([0.2, 2.0])
  starts = np.asarray(jax.jit(jax.vmap(lambda g: ot.c_transform_start(
      jnp.asarray(b), jnp.asarray(C), ot.SquaredL2(g))))(gammas))
  for i, g in enumerate([0.2, 2.0]):
    single = c_transform_start(jnp.asarray(b), jnp.asarray(C), ot.SquaredL2(g))
    np.testing.assert_allclose(starts[i], np.asarray(single), rtol=1e-12)
  assert not np.allclose(starts[0], starts[1])


def test_integer_costs_give_a_float_start():
  C = jnp.asarray([[3, 1, 4], [1, 5, 9]])
  alpha = c_transform_start(jnp.ones(3), C, ot.SquaredL2(1.0))
  assert jnp.issubdtype(alpha.dtype, jnp.floating)
  np.testing.assert_allclose(np.asarray(alpha), _soft_min(np.asarray(C, float), np.ones(3),
                                                           _eps(1.0, np.asarray(C, float))))
