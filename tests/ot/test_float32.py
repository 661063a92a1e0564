"""float32 solves reach the float64 optimum.

The small problem below has a row of constant cost, so the semi-dual is linear
along a stretch from alpha = 0 on (tested from there and from the default start): the gradient does not change between the first
two L-BFGS iterates except by float32 rounding. That rounding once passed for
curvature and scaled the next step by ~1e7, where the k-sparse projection loses
all precision (the plan came out zero and the value 1.7e9).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import problem
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import projections

C = np.array([[0., 1., 2.], [1., 0., 1.], [2., 1., 0.], [0.5, 0.5, 0.5]])
A = np.full(4, 0.25)
B = np.full(3, 1 / 3)

REGULARIZERS = {
    "sparse_k2_gamma0.1": ot.SparsityConstrained(k=2, gamma=0.1),
    "sparse_k2_gamma1": ot.SparsityConstrained(k=2, gamma=1.0),
    "l2_gamma0.1": ot.SquaredL2(gamma=0.1),
    "kl_gamma0.1": ot.NegEntropy(gamma=0.1),
}


def _solve(dtype, reg, formulation, start):
  # (Inputs cast in numpy: an eager cast on the device compiles a program each.)
  init = None if start == "default" else (np.zeros(4, dtype), np.zeros(3, dtype))
  return ot.solve(np.asarray(A, dtype), np.asarray(B, dtype), np.asarray(C, dtype), reg,
                  formulation=formulation, solver="lbfgs", init=init)


# The optimal values, in float64: 13/96 (k = 2 does not bind at gamma = 0.1,
# the squared-L2 optimum), 11/48, and for NegEntropy the float64 semi-dual,
# dual (tol 1e-12) and POT's smooth_ot_dual, which agree to 1e-14 (as do the
# interior point's for the sparse ones).
OPTIMUM = {
    "sparse_k2_gamma0.1": 13 / 96,
    "sparse_k2_gamma1": 11 / 48,
    "l2_gamma0.1": 13 / 96,
    "kl_gamma0.1": -0.04109928327014,
}


# The dual's default start is alpha = beta = 0 already: "zero" there is the
# same run as "default", so it is tested for the semi-dual only.
@pytest.mark.float32
@pytest.mark.parametrize("formulation,start", [("semi_dual", "default"), ("semi_dual", "zero"),
                                               ("dual", "default")])
@pytest.mark.parametrize("name", sorted(REGULARIZERS))
def test_float32_reaches_the_float64_value(name, formulation, start):
  reg = REGULARIZERS[name]
  res = _solve(jnp.float32, reg, formulation, start)
  assert res.plan.dtype == jnp.float32
  np.testing.assert_allclose(float(res.value), OPTIMUM[name], rtol=1e-4)
  # The plan carries the whole mass (1), as the float64 one does.
  np.testing.assert_allclose(np.asarray(res.plan).sum(), A.sum(), rtol=1e-3)


def _large_mass_problem(m, n, seed):
  """One unit of mass per row (total m), costs in [0, 100] with the row minima at 0.

  Clustering's E-step has this shape (a = 1 per point, b = m / n per cluster).
  """
  rng = np.random.default_rng(seed)
  C = 100.0 * rng.random((m, n)) ** 0.3
  return np.ones(m), np.full(n, m / n), C - C.min(axis=1, keepdims=True)


@pytest.mark.float32
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("reg", [ot.SquaredL2(gamma=1.0), ot.SparsityConstrained(k=1150, gamma=1.0)],
                         ids=["l2", "sparse_k1150"])
def test_float32_large_mass_marginals_do_not_crawl(reg, seed):
  # With m = 10,000 rows of mass 1, L-BFGS's first step on the per-unit-mass
  # objective is so short that the gradient change it causes is below float32
  # rounding: no curvature pair was ever stored, and each later step had that
  # same length (300 iterations left rows about 1.5 off). The step now grows
  # until the curvature shows.
  m, n = 10_000, 10
  a, b, C = _large_mass_problem(m, n, seed)
  with jax.enable_x64(True):
    ref = ot.solve(a, b, C, reg, formulation="semi_dual", max_iter=300, tol=1e-6 / m)
    ref_value = float(ref.value)
  assert int(ref.status) == 0  # converged to the marginal tolerance
  res = ot.solve(np.asarray(a, np.float32), np.asarray(b, np.float32),
                 np.asarray(C, np.float32), reg, formulation="semi_dual", max_iter=300,
                 tol=1e-6 / m)
  assert int(res.num_iter) < 100
  # float32 stops at its rounding floor ("stalled"): the objective, a sum of m
  # terms, cannot resolve the rest. Rows within 0.05 of their unit of mass.
  np.testing.assert_allclose(float(res.value), ref_value, rtol=1e-5)
  assert float(np.max(np.abs(np.asarray(res.plan).sum(axis=1) - 1))) < 0.05


# Jitted as in the solvers (one compile instead of one per primitive); its
# loop is one program either way, and on this data the loop without the
# shrinking-set rule cycles for all m + 2 rounds jitted too.
_michelot = jax.jit(projections._michelot, static_argnums=(2,))


@pytest.mark.float32
@pytest.mark.parametrize("axis", [0, 1])        # two reductions / one variadic one
def test_float32_michelot_threshold_stops_in_few_rounds(axis):
  # Michelot's active set only shrinks in exact arithmetic. On these 64
  # columns of 5,000 (seed 19, b = 1000) a float32-rounded tau let an entry
  # back in and the count cycled for all m + 2 rounds: a whole solve at
  # (50000, 10, 5750) in float32 took minutes instead of seconds.
  x = np.random.default_rng(19).normal(size=(5000, 64)) + 3.0
  b = 1000.0
  tau, count, rounds = _michelot(
      np.asarray(x if axis == 0 else x.T, np.float32), jnp.float32(b), axis, None)
  assert int(rounds) < 50
  tau, count = np.asarray(tau), np.asarray(count)
  tau, count = (tau, count) if axis == 0 else (tau.T, count.T)
  # float64 reference by sorting (Duchi et al.): the largest (cumsum_r - b) / r.
  srt = -np.sort(-x, axis=0)
  ref = np.max((np.cumsum(srt, axis=0) - b) / np.arange(1, 5001)[:, None], axis=0)
  np.testing.assert_allclose(tau[0], ref, rtol=1e-5, atol=1e-5)
  # Entries within float32 rounding of tau may fall on either side.
  assert np.max(np.abs(count[0] - np.sum(x > ref, axis=0))) <= 1


@pytest.mark.float32
@pytest.mark.parametrize("seed", [0, 4])
def test_float32_line_search_goes_on_where_values_no_longer_resolve_gains(seed):
  # Near the optimum the objective's gain per step falls below float32
  # rounding and Armijo's test on values fails: the solve stalled 1.6e-4 and
  # 2.4e-4 below the float64 optimum on these problems. Accepting steps on the
  # slopes (approximate Armijo) there takes it to within 2e-5.
  a, b, C = problem(200, 100, seed, shift=1.0)
  reg = ot.SparsityConstrained(k=2, gamma=1.0)
  with jax.enable_x64(True):
    ref = float(ot.solve(a, b, C, reg, max_iter=3000).value)
  res = ot.solve(np.asarray(a, np.float32), np.asarray(b, np.float32),
                 np.asarray(C, np.float32), reg)
  assert (ref - float(res.value)) / abs(ref) < 6e-5


@pytest.mark.float32
@pytest.mark.parametrize("reg", [ot.SparsityConstrained(k=575, gamma=0.1),
                                 ot.SparsityConstrained(k=5, gamma=0.1), ot.SquaredL2(0.1)],
                         ids=["sparse_radix", "sparse_compact", "l2"])
def test_float32_semi_dual_value_matches_float64_with_many_active_entries(reg):
  """5000 x 10, hundreds of entries per column in the projection, |alpha - C| / gamma ~ 10
  against plan entries ~1e-4: the value must not inherit the rounding of the
  plan's column sums. Summed as t (s / gamma - t / 2) it was off by 1.3e-6 to
  2e-6 relative here (now 1.5e-7 to 2.1e-7), 3e-4 at 50,000 x 10, where it
  stalled L-BFGS."""
  from vmoe_sparse_ot.ot import objectives
  a, b, C = problem(5000, 10, seed=1)
  rng = np.random.default_rng(0)
  alpha = (rng.random(5000) * 0.05).astype(np.float32)
  a32, b32, C32 = (np.asarray(v, np.float32) for v in (a, b, C))
  # Jitted as in the solvers (and one compile instead of one per primitive).
  value = jax.jit(lambda *x: objectives.semi_dual_value_and_grad(*x, reg)[0])
  got = float(value(*(jnp.asarray(v) for v in (alpha, a32, b32, C32))))
  with jax.enable_x64(True):
    want = float(value(*(np.asarray(v, np.float64) for v in (alpha, a32, b32, C32))))
  assert abs(got - want) <= 1e-6 * abs(want), (got, want)
