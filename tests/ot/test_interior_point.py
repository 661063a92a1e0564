"""solve_interior_point: the exact optimum of binding-k problems, with a certificate."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import problem, semi_dual_objective, spy
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import interior_point as ipm

# Jitted (static sizes): one program per problem shape instead of one per
# primitive eagerly.
schur_products = jax.jit(ipm._schur_products, static_argnums=(3, 4))
column_sums = jax.jit(ipm._column_sums, static_argnums=(1, 2))

# The optimum of P_Psi from an independent interior-point solver: Clarabel
# 0.11.1 through cvxpy 1.9.3 on the second-order-cone form
#   min <T, C> + gamma/2 sum Z  s.t.  Z_ij L_ij >= T_ij^2, 0 <= L <= 1,
#   L^T 1 = k, T >= 0, T 1 = a, T^T 1 = b
# (tolerances 1e-10), its plan's value recomputed with the k-support norm.
# (m, n, k, gamma, seed, uniform) -> optimal value.
CLARABEL = {
    (30, 30, 3, 0.5, 0, True): 0.02142716569366,
    (12, 8, 2, 0.1, 3, False): 0.04588529813092,
    (40, 25, 3, 1.0, 7, False): 0.03337546296264,
}


@pytest.mark.parametrize("case", sorted(CLARABEL))
def test_value_agrees_with_an_independent_conic_solver(case):
  m, n, k, gamma, seed, uniform = case
  a, b, C = problem(m, n, seed=seed, uniform=uniform)
  res = ot.solve_interior_point(a, b, C, ot.SparsityConstrained(k, gamma))
  assert res.reason() == "converged"
  assert float(res.value) == pytest.approx(CLARABEL[case], rel=1e-8)


@pytest.mark.parametrize("rtol", [1e-10, 1e-2])
def test_gap_brackets_the_optimum_and_status_is_honest(rtol):
  # value <= optimum <= value + duality_gap (the gap is P_Psi at a coupling),
  # also when a loose rtol stops the barrier early: "converged" only when the
  # two bounds agree to 1e-6, "stalled" otherwise.
  case = (30, 30, 3, 0.5, 0, True)
  m, n, k, gamma, seed, uniform = case
  a, b, C = problem(m, n, seed=seed, uniform=uniform)
  res = ot.solve_interior_point(a, b, C, ot.SparsityConstrained(k, gamma), rtol=rtol)
  value, gap, best = float(res.value), float(res.duality_gap), CLARABEL[case]
  # Clarabel's value is the k-support primal at its plan, solved to 1e-10: the
  # gap, P_Psi at the sparse coupling primal_plan (marginals to 1e-16), puts
  # the optimum 5e-12 below it (within 7e-13 of value), so it is compared at
  # Clarabel's accuracy.
  assert value <= best * (1 + 1e-12) and best <= value + gap + 1e-10 * best
  assert res.reason() == ("converged" if gap <= 1e-6 * abs(value) else "stalled")
  if rtol == 1e-2:
    assert res.reason() == "stalled"


# Two seeds of one size, and a problem where k binds for certain (n k < m:
# no k-sparse coupling) of the size the candidate-support tests below solve
# (its interior point compiled once for the file).
@pytest.mark.parametrize("m,n,k,gamma,seed", [(60, 40, 2, 1.0, 0), (60, 40, 2, 1.0, 1),
                                              (60, 6, 5, 0.1, 2)])
def test_certified_and_at_least_as_good_as_lbfgs(m, n, k, gamma, seed):
  a, b, C = problem(m, n, seed=seed, uniform=seed % 2 == 0)
  reg = ot.SparsityConstrained(k, gamma)
  res = ot.solve_interior_point(a, b, C, reg)
  value, gap = float(res.value), float(res.duality_gap)
  # The gap is P_Psi of the barrier's plan (marginals met to ~1e-10) minus
  # the semi-dual at alpha: the two bounds on the optimum agree.
  assert abs(gap) <= 1e-6 * abs(value)
  # L-BFGS stops on the kink below (or at) it, however long it runs.
  lbfgs = ot.solve(a, b, C, reg, max_iter=3000, solver=ot.LBFGS(rtol=1e-13))
  assert float(lbfgs.value) <= value + 1e-12 * abs(value)
  # The returned potentials are what `value` is: the semi-dual at alpha.
  assert float(semi_dual_objective(res.alpha, a, b, C, reg)) == pytest.approx(value, rel=1e-12)
  assert np.all(np.sum(np.asarray(res.plan) != 0, axis=0) <= k)


def test_non_binding_k_matches_lbfgs():
  # k large enough that no column binds: the semi-dual is smooth there and
  # L-BFGS meets the marginals; both solvers find the same optimum and plan.
  a, b, C = problem(40, 6, seed=4)
  reg = ot.SparsityConstrained(k=30, gamma=1.0)
  lbfgs = ot.solve(a, b, C, reg, tol=1e-9, max_iter=2000)
  assert lbfgs.reason() == "converged"
  res = ot.solve_interior_point(a, b, C, reg)
  assert float(res.value) == pytest.approx(float(lbfgs.value), rel=1e-9)
  np.testing.assert_allclose(np.asarray(res.plan), np.asarray(lbfgs.plan), atol=1e-8)


def test_shifted_cost_shifts_the_value_only():
  # (A problem of the Clarabel cases above: its interior point is compiled.)
  a, b, C = problem(12, 8, seed=3, uniform=False)
  reg = ot.SparsityConstrained(k=2, gamma=0.5)
  r0 = ot.solve_interior_point(a, b, C, reg)
  r1 = ot.solve_interior_point(a, b, C - 2.0, reg)
  assert float(r1.value) == pytest.approx(float(r0.value) - 2.0, abs=1e-9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(reg=ot.SquaredL2(1.0)), "regularizer"),
    (dict(reg=ot.SparsityConstrained(k=8, gamma=1.0)), "regularizer.k"),
    (dict(a_zero=True), "a must be positive"),
    (dict(max_newton=0), "max_newton"),
    (dict(rtol=0.0), "rtol"),
])
def test_bad_arguments_name_themselves(kwargs, match):
  a, b, C = problem(8, 5, seed=0)
  if kwargs.pop("a_zero", False):
    a = np.concatenate([[0.0], a[1:] * (1 / a[1:].sum())])
  reg = kwargs.pop("reg", ot.SparsityConstrained(k=2, gamma=1.0))
  with pytest.raises(ValueError, match=match):
    ot.solve_interior_point(a, b, C, reg, **kwargs)


# Candidate supports: the barrier on a few entries per row (for problems whose
# dense Newton system, O(m n^2) per step, is too large).
def _random_mask(m, n, seed):
  rng = np.random.RandomState(seed)
  mask = rng.rand(m, n) < 0.3
  mask[np.arange(m), rng.randint(n, size=m)] = True   # every row has an entry
  mask[m // 2] = True                                  # and one row has all
  return mask


@pytest.mark.parametrize("m,n,seed", [(15, 6, 0), (40, 9, 1)])
def test_support_layout_and_products_match_dense_matrices(m, n, seed):
  mask = _random_mask(m, n, seed)
  support = ipm.support_of(mask)
  cols, valid = np.asarray(support.cols), np.asarray(support.valid)
  width = cols.shape[1]
  # Slots: each row's entries, padded to a power of two; pairs likewise.
  assert width == min(n, 1 << int(mask.sum(1).max() - 1).bit_length())
  for i in range(m):
    assert sorted(cols[i][valid[i]]) == sorted(np.nonzero(mask[i])[0])
  assert support.pair_cells.shape[0] == 1 << int((mask.sum(1) ** 2).sum() - 1).bit_length()
  # Brute force: (m, n) matrices with zeros off the mask.
  rng = np.random.RandomState(seed + 10)
  P, Q = rng.randn(m, n) * mask, rng.randn(m, n) * mask
  on_slots = [np.where(valid, np.take_along_axis(x, cols, 1), 0) for x in (P, Q)]
  tt, tl, ll = schur_products(*on_slots, support, n, False)
  for got, want in ((tt, P.T @ P), (tl, P.T @ Q), (ll, Q.T @ Q)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12, atol=1e-12)
  sums = column_sums(support, n, False, *on_slots)
  np.testing.assert_allclose(np.asarray(sums[0]), P.sum(0), rtol=1e-12, atol=1e-12)
  np.testing.assert_allclose(np.asarray(sums[1]), Q.sum(0), rtol=1e-12, atol=1e-12)


def test_candidate_support_reaches_the_dense_optimum():
  # n k <= m: k binds in every column. From a rough start (20 L-BFGS
  # iterations) the support is grown until its bounds agree, at the dense
  # interior point's optimum. (The problem of the next test: they share
  # their compiled solvers.)
  m, n, k, gamma, seed = 60, 6, 5, 0.1, 0
  a, b, C = problem(m, n, seed=seed, uniform=seed % 2 == 0)
  reg = ot.SparsityConstrained(k, gamma)
  dense = ot.solve_interior_point(a, b, C, reg)
  assert dense.reason() == "converged"
  rough = ot.solve(a, b, C, reg, max_iter=20, interior_point=False)
  res = ipm.solve_on_candidates(a, b, C, reg, rough.alpha)
  value, gap, best = float(res.value), float(res.duality_gap), float(dense.value)
  assert res.reason() == "converged"
  assert value == pytest.approx(best, rel=1e-9)
  # Each result's two bounds bracket the other's value.
  assert value <= best + float(dense.duality_gap) and best <= value + gap
  assert float(semi_dual_objective(res.alpha, a, b, C, reg)) == pytest.approx(value, rel=1e-12)
  # The whole problem as a "candidate" support: the pair-list Newton system
  # gives the dense one's optimum.
  full = ipm.solve_positive(a, b, C, reg, support=ipm.support_of(np.ones((m, n), bool)))
  assert float(full.value) == pytest.approx(best, rel=1e-9)


def test_init_runs_on_candidates_and_is_checked(monkeypatch):
  a, b, C = problem(60, 6, seed=0)
  reg = ot.SparsityConstrained(5, 0.1)
  dense = ot.solve_interior_point(a, b, C, reg)
  rough = ot.solve(a, b, C, reg, max_iter=20, interior_point=False)
  calls = spy(monkeypatch, ipm, "solve_on_candidates")
  for init in (rough, rough.alpha):
    res = ot.solve_interior_point(a, b, C, reg, init=init)
    assert res.reason() == "converged"
    assert float(res.value) == pytest.approx(float(dense.value), rel=1e-9)
  assert len(calls) == 2
  np.testing.assert_array_equal(np.asarray(calls[0][4]), np.asarray(rough.alpha))
  with pytest.raises(ValueError, match="init alpha"):
    ot.solve_interior_point(a, b, C, reg, init=np.zeros(5))


def test_best_upper_bound_walks_back_from_the_newest_plan_until_worse():
  # A ring of _KEPT plans written at slot c % _KEPT by the c-th centered mu;
  # the plans here are their mu's number, the bounds fall then rise going back.
  kept = ipm._KEPT
  centered = kept + 3                      # the ring has wrapped: newest in slot 2
  plans = np.arange(kept, dtype=float)
  for c in range(kept, centered):
    plans[c % kept] = c
  # A tie goes on (stalled Newton steps keep one plan at two mus), a NaN is
  # skipped, the first worse bound stops the walk: 5 is never reached.
  bounds = {10: 5.0, 9: 5.0 * (1 + 1e-12), 8: 2.0, 7: np.nan, 6: 4.0, 5: 1.0}
  seen = []

  def bound(plan):
    seen.append(int(plan))
    return bounds[int(plan)]
  # (The bound and the plan that gave it.)
  assert ipm._best_upper_bound(plans, centered, None, True, bound) == (2.0, 8.0)
  assert seen == [10, 9, 8, 7, 6]
  # The last step did not center: its plan comes first; fewer than _KEPT mus: only those.
  seen.clear()
  bounds[-1] = 0.5
  assert ipm._best_upper_bound(plans, centered, -1.0, False, bound) == (0.5, -1.0)
  assert seen == [-1, 10]
  seen.clear()
  assert ipm._best_upper_bound(np.arange(kept, dtype=float), 2, None, True,
                               lambda p: seen.append(int(p)) or -p) == (-1.0, 1.0)
  assert seen == [1, 0]


def test_candidates_of_block_structured_costs_are_linked():
  # Two groups of rows, each cheap to its own group of columns: the mask's
  # entries fall apart into two groups, where the barrier's constraints lose
  # rank. A whole column is added to link them; the result is the optimum.
  # (The size and k of the tests above: their solvers are compiled.)
  rng = np.random.RandomState(5)
  m, n, k = 60, 6, 5
  C = rng.rand(m, n) * 0.1
  C[:30, 3:] += 10.0
  C[30:, :3] += 10.0
  a, b = np.full(m, 1 / m), np.full(n, 1 / n)
  reg = ot.SparsityConstrained(k, 0.1)
  rough = ot.solve(a, b, C, reg, max_iter=20, interior_point=False)
  mask = ipm.candidate_mask(rough.alpha, C, k)
  assert mask.all(axis=0).sum() == 1            # the linking column
  without = mask.copy()
  without[:, mask.all(axis=0)] = False
  assert not without[:30, 3:].any() and not without[30:, :3].any()   # two groups
  res = ipm.solve_on_candidates(a, b, C, reg, rough.alpha)
  dense = ot.solve_interior_point(a, b, C, reg)
  assert res.reason() == "converged"
  assert float(res.value) == pytest.approx(float(dense.value), rel=1e-9)


def test_rounds_report_the_best_value_with_the_best_bound(monkeypatch):
  # Round 1: the higher value with a loose bound; round 2: slightly lower,
  # but its barrier finished with a tight bound. The result keeps round 1's
  # value and alpha with round 2's bound, and the two agree: converged.
  a, b, C = problem(30, 6, seed=1)
  reg = ot.SparsityConstrained(3, 0.1)
  rounds = iter([(1.0, 1.0, ipm.optim.STALLED), (1.0 - 1e-9, 1e-8, ipm.optim.CONVERGED)])
  rng = np.random.RandomState(0)

  def fake(a, b, C, reg, **kwargs):
    value, gap, status = next(rounds)
    return ot.OTResult(plan=None, value=jnp.asarray(value), alpha=jnp.asarray(rng.randn(30)),
                       beta=None, num_iter=jnp.asarray(7), grad_norm=None,
                       converged=jnp.asarray(status == ipm.optim.CONVERGED),
                       duality_gap=jnp.asarray(gap), num_evals=jnp.asarray(7), trace=None,
                       status=jnp.asarray(status))
  monkeypatch.setattr(ipm, "solve_positive", fake)
  res = ipm.solve_on_candidates(a, b, C, reg, np.zeros(30))
  assert float(res.value) == 1.0 and res.reason() == "converged"
  assert float(res.duality_gap) == pytest.approx(9e-9, rel=1e-6)   # (1 - 1e-9 + 1e-8) - 1
  assert int(res.num_iter) == 14
