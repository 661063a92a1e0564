"""Whether `solve`'s plan is a coupling: its marginal errors, the n k < m warning,
the interior point's `primal_plan`, and costs of 1e30.

The 4 x 3 problems (issue 30) are checked against values worked out by hand:

  C = [[3, 4, 1], [9, 5, 8], [3, 8, 0], [5, 1, 3]].

k = 1, a = 1/4, b = 1/3 (each entry), gamma = 1. Psi(t) = ||t||_1^2 / 2 for
k = 1, so on couplings P_Psi = <T, C> + gamma/2 ||b||^2 = LP + 1/6. The LP's
optimum is 2.75: the plan T_lp below costs 3/6 + 1/12 + 9/6 + 5/12 + 1/4 =
2.75, and the potentials u = (3, 9, 2, 5), v = (0, -4, -2) satisfy u_i + v_j
<= C_ij with equality on T_lp's support and sum(a u) + sum(b v) = 19/4 - 2 =
2.75. Optimum 2.75 + 1/6 = 35/12. Every plan with one nonzero per column
leaves at least one row of mass 1/4 empty while its columns carry all the
mass: its rows are off by 1/2 of the mass in L1 (row_error >= 1/2).

k = 2, a = 3, b = 4 (total mass 12), gamma = 1. Upper bound: the coupling
T_k2 below costs <T, C> = 33.5; its columns' squared 2-support norms (the
closed form of Argyriou et al., `_squared_k_support`) are 8 (entries
1.5, 1, 1, 0.5: r = 1, (sum)^2 / 2), 8 (2, 2) and 8.5 (1.5, 2.5), so P_Psi =
33.5 + (8 + 8 + 8.5) / 2 = 45.75. Lower bound: at alpha = (0, 6, 0, 2) the
columns' alpha - c_j are (-3, -3, -3, -3), (-4, 1, -8, 1), (-1, -2, 0, -1);
their best 2-sparse t of mass 4 are (2, 2) (value -16), (2, 2) on rows 1, 3
(value 0) and (1.5, 2.5) on rows 0, 2 (value -5.75), so S = 3 (0 + 6 + 0 + 2)
+ 16 + 0 + 5.75 = 45.75. The optimum is 45.75. Its plans (the maximisers'
hull in each column, then the marginals) form the segment T00 = x in
[1.5, 2], T02 = 3 - x, T30 = 2.5 - x, T32 = x - 1.5, the rest of T_k2 fixed:
column 0 holds 4 nonzeros on all of it, so no optimal coupling is 2-sparse.
The 2-sparse couplings themselves (spanning trees of the 4 + 3 nodes, each
one coupling) cost at least 47, so a 2-sparse plan at value 45.75 is never
a coupling. Ties broken by the lower index, the plan at that alpha puts
column 0 on rows 0, 1 and column 2 on rows 0, 2: row sums (3.5, 4, 2.5, 2),
12.5% of the mass missing, row_error 0.25.
"""
import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import primal_objective, supports
from vmoe_sparse_ot import ot

C = np.array([[3, 4, 1], [9, 5, 8], [3, 8, 0], [5, 1, 3]], np.float64)
T_LP = np.array([[2, 0, 1], [2, 1, 0], [0, 0, 3], [0, 3, 0]]) / 12
U, V = np.array([3.0, 9, 2, 5]), np.array([0.0, -4, -2])
T_K2 = np.array([[1.5, 0, 1.5], [1, 2, 0], [0.5, 0, 2.5], [1, 2, 0]])
ALPHA_K2 = np.array([0.0, 6, 0, 2])


def _squared_k_support(t, k):
  """||t||_(k)^2 by its closed form: t sorted descending, the r in 0..k-1 with
  t_(k-r-1) > (sum of t_(k-r) onwards) / (r + 1) >= t_(k-r) (t_(-1) = inf)."""
  t = np.sort(np.abs(t))[::-1]
  for r in range(k):
    tail = t[k - r - 1:].sum() / (r + 1)
    head = np.inf if k - r - 2 < 0 else t[k - r - 2]
    if head > tail >= t[k - r - 1]:
      return float((t[:k - r - 1] ** 2).sum() + (r + 1) * tail ** 2)
  raise AssertionError("no r")


def _p_psi(T, k, gamma):
  return float((T * C).sum() + gamma / 2 * sum(_squared_k_support(t, k) for t in T.T))


def _semi_dual(alpha, a, b, k, gamma):
  """(S(alpha), its plan) by brute force: each column's best t over supports
  of size <= k (in lexicographic order, so ties go to the lower indices)."""
  value, plan = float(alpha @ a), np.zeros(C.shape)
  for j in range(C.shape[1]):
    s, best = alpha - C[:, j], -np.inf
    for support in supports(C.shape[0], k):
      idx = list(support)
      t = s[idx] / gamma
      t = t - (t.sum() - b[j]) / len(idx)
      if t.min() >= 0 and float(s[idx] @ t - gamma / 2 * t @ t) > best:
        best = float(s[idx] @ t - gamma / 2 * t @ t)
        plan[:, j] = 0
        plan[idx, j] = t
    value -= best
  return value, plan


def _l1_errors(T, a, b):
  T = np.asarray(T)
  return (np.abs(T.sum(1) - a).sum() / a.sum(), np.abs(T.sum(0) - b).sum() / a.sum())


def _check_primal_plan(res, a, b, reg):
  P = np.asarray(res.primal_plan)
  assert np.abs(P.sum(1) - a).max() <= 1e-9 * a.sum()
  assert np.abs(P.sum(0) - b).max() <= 1e-9 * a.sum()
  assert P.min() >= 0
  np.testing.assert_array_equal(np.asarray(res.primal_nnz_per_column),
                                np.count_nonzero(P, axis=0))
  # The certificate: duality_gap is P_Psi of primal_plan minus the value.
  assert float(primal_objective(P, C, reg)) == pytest.approx(
      float(res.value) + float(res.duality_gap), rel=1e-12)
  return P


def test_hand_values():
  # The docstring's numbers, recomputed from its plans and potentials.
  a, b = np.full(4, 0.25), np.full(3, 1 / 3)
  assert np.allclose(T_LP.sum(1), a) and np.allclose(T_LP.sum(0), b)
  assert np.all(U[:, None] + V[None, :] <= C)
  assert np.all((U[:, None] + V[None, :] == C)[T_LP > 0])
  assert (T_LP * C).sum() == pytest.approx(2.75) and a @ U + b @ V == pytest.approx(2.75)
  a, b = np.full(4, 3.0), np.full(3, 4.0)
  assert np.allclose(T_K2.sum(1), a) and np.allclose(T_K2.sum(0), b)
  assert _p_psi(T_K2, 2, 1.0) == pytest.approx(45.75, rel=1e-15)
  value, plan = _semi_dual(ALPHA_K2, a, b, 2, 1.0)
  assert value == pytest.approx(45.75, rel=1e-15)
  # 2-sparse couplings: two rows per column (one row holds 3 < 4), 6 entries
  # for 7 marginals: a spanning tree, one coupling each where it is >= 0.
  best = np.inf
  for rows in itertools.product(itertools.combinations(range(4), 2), repeat=3):
    cells = [(i, j) for j, pair in enumerate(rows) for i in pair]
    A = np.zeros((7, 6))
    for e, (i, j) in enumerate(cells):
      A[i, e] = A[4 + j, e] = 1
    x = np.linalg.lstsq(A, np.r_[a, b], rcond=None)[0]
    if np.abs(A @ x - np.r_[a, b]).max() < 1e-9 and x.min() >= -1e-12:
      T = np.zeros((4, 3))
      T[tuple(np.array(cells).T)] = x
      best = min(best, float((T * C).sum() + 0.5 * (T * T).sum()))
  assert best == pytest.approx(47.0)
  # The plan at ALPHA_K2 (ties to the lower index): 12.5% of the mass missing.
  np.testing.assert_allclose(plan.sum(1), [3.5, 4, 2.5, 2], atol=1e-12)
  assert _l1_errors(plan, a, b)[0] == pytest.approx(0.25)


def test_k1_no_k_sparse_coupling_warns_and_reports_the_missing_row():
  a, b = np.full(4, 0.25), np.full(3, 1 / 3)
  reg = ot.SparsityConstrained(1, 1.0)
  with pytest.warns(ot.KSparseInfeasibleWarning) as record:
    res = ot.solve(a, b, C, reg)
  assert len(record) == 1
  message = str(record[0].message)
  assert "\n" not in message and "n k = 3 x 1 = 3 < m = 4" in message
  # The value is certified, but the plan is no coupling: not converged.
  assert res.reason() == "interior_point" and not bool(res.converged)
  assert float(res.value) == pytest.approx(35 / 12, rel=1e-9)
  row, col = _l1_errors(res.plan, a, b)
  assert float(res.row_error) == pytest.approx(row, rel=1e-12) and row >= 0.5 - 1e-9
  assert float(res.col_error) == pytest.approx(col, abs=1e-12) and col <= 1e-12
  assert not bool(res.plan_feasible)
  P = _check_primal_plan(res, a, b, reg)
  # primal_plan solves the LP: zero where u_i + v_j < C_ij.
  assert np.all(P[U[:, None] + V[None, :] < C] <= 1e-9)
  text = res.reason(full=True)
  assert text.startswith("interior_point: value certified")
  assert "plan infeasible (row_error 0.5" in text and "primal_plan is a coupling" in text
  # The option: an error before solving, or nothing at all.
  with pytest.raises(ValueError, match="infeasible='raise'.*n k = 3 x 1 = 3 < m = 4"):
    ot.solve(a, b, C, reg, infeasible="raise")
  with pytest.raises(ValueError, match="infeasible must be one of"):
    ot.solve(a, b, C, reg, infeasible="yes")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    quiet = ot.solve(a, b, C, reg, infeasible="ignore")
  assert float(quiet.value) == float(res.value)


def test_k2_value_is_the_hand_optimum_and_primal_plan_is_on_its_segment():
  a, b = np.full(4, 3.0), np.full(3, 4.0)
  reg = ot.SparsityConstrained(2, 1.0)
  with warnings.catch_warnings():
    warnings.simplefilter("error")   # n k = 6 >= 4: no warning
    res = ot.solve(a, b, C, reg)
  # The value is certified, but no optimal plan is 2-sparse: not converged.
  assert res.reason() == "interior_point" and not bool(res.converged)
  assert float(res.value) == pytest.approx(45.75, rel=1e-9)
  row, col = _l1_errors(res.plan, a, b)
  # No 2-sparse plan at the optimum is a coupling (see the module docstring).
  assert float(res.row_error) == pytest.approx(row, rel=1e-12) and row > 0.05
  assert float(res.col_error) == pytest.approx(col, abs=1e-12)
  assert not bool(res.plan_feasible)
  P = _check_primal_plan(res, a, b, reg)
  x = P[0, 0]
  # The interior point stops once its two bounds agree to 1e-6 (its 'converged'),
  # so its plan lies on the optimal face to that accuracy: measured 7e-7 off it on
  # an AMD EPYC, under 1e-8 on the machine the test was written on.
  assert 1.5 - 1e-6 <= x <= 2 + 1e-6
  segment = T_K2 + np.array([[x - 1.5, 0, 1.5 - x], [0, 0, 0], [0, 0, 0],
                             [1.5 - x, 0, x - 1.5]])
  np.testing.assert_allclose(P, segment, atol=2e-6)
  assert int(np.asarray(res.primal_nnz_per_column)[0]) == 4


@pytest.mark.parametrize("case", ["integers", "mass 1e20", "mass 1e-7", "gamma 1e-8"])
def test_scaled_and_integer_variants_report_their_plans(case):
  a, b, c, gamma = np.full(4, 3), np.full(3, 4), C.astype(np.int64), 1.0
  if case.startswith("mass"):
    scale = float(case.split()[1]) / 12
    a, b, c = a * scale, b * scale, C
  elif case == "gamma 1e-8":
    a, b, c, gamma = a / 12, b / 12, C, 1e-8
  reg = ot.SparsityConstrained(2, gamma)
  res = ot.solve(a, b, c, reg)
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  assert res.reason() == "interior_point"     # the value certified ...
  assert not bool(res.converged)               # ... the plan no coupling
  row, col = _l1_errors(res.plan, a, b)
  assert float(res.row_error) == pytest.approx(row, rel=1e-9, abs=1e-15)
  assert float(res.col_error) == pytest.approx(col, rel=1e-9, abs=1e-15)
  assert bool(res.plan_feasible) == (max(row, col) <= ot.PLAN_FEASIBLE_RTOL)
  assert not bool(res.plan_feasible)    # rows 0.7 to 50% of the mass off
  _check_primal_plan(res, a, b, reg)
  if case == "integers":
    assert float(res.value) == pytest.approx(45.75, rel=1e-9)


def test_fields_under_jit_and_vmap():
  a, b = np.full(4, 3.0), np.full(3, 4.0)
  reg = ot.SparsityConstrained(2, 1.0)
  costs = np.stack([C, C + 1.0])                 # numpy: jnp.stack compiles a program
  out = jax.jit(jax.vmap(lambda c: ot.solve(a, b, c, reg)))(costs)
  assert out.row_error.shape == (2,) and out.plan_feasible.shape == (2,)
  assert out.plan_feasible.dtype == jnp.bool_
  assert out.primal_plan is None and out.primal_nnz_per_column is None
  # Read back once: indexing a jax array compiles a program per call site.
  plan, row_error, col_error, feasible = map(
      np.asarray, (out.plan, out.row_error, out.col_error, out.plan_feasible))
  for i in range(2):
    row, col = _l1_errors(plan[i], a, b)
    assert float(row_error[i]) == pytest.approx(row, rel=1e-9, abs=1e-15)
    assert float(col_error[i]) == pytest.approx(col, rel=1e-9, abs=1e-15)
    assert bool(feasible[i]) == (max(row, col) <= ot.PLAN_FEASIBLE_RTOL)


def test_costs_of_1e30_reach_the_unscaled_plan():
  a, b = np.full(4, 0.25), np.full(3, 1 / 3)
  # C and gamma 1e30 times a problem's: the same plan. L-BFGS took one step
  # (status "stalled", 30% short) before the costs were scaled internally.
  big = ot.solve(a, b, C * 1e30, ot.SquaredL2(0.1 * 1e30), tol=1e-10)
  unit = ot.solve(a, b, C, ot.SquaredL2(0.1), tol=1e-10)
  assert big.reason() == unit.reason() == "converged"
  np.testing.assert_allclose(np.asarray(big.plan), np.asarray(unit.plan), atol=1e-9)
  assert float(big.value) == pytest.approx(float(unit.value) * 1e30, rel=1e-9)
  big_alpha, unit_alpha = np.asarray(big.alpha), np.asarray(unit.alpha)
  np.testing.assert_allclose(big_alpha - big_alpha[0], (unit_alpha - unit_alpha[0]) * 1e30,
                             rtol=1e-6, atol=1e22)
  # gamma 0.1 against costs of 1e30 is the unregularized problem with C and
  # gamma 1e-31: no scaling changes that; the interior point certifies both
  # (value 2.75e30 + 0.1 / 6) and returns the same coupling.
  reg = ot.SparsityConstrained(2, 0.1)
  big = ot.solve(a, b, C * 1e30, reg)
  unit = ot.solve(a, b, C, ot.SparsityConstrained(2, 1e-31))
  assert big.reason() == unit.reason() == "interior_point"
  assert float(big.value) == pytest.approx(2.75e30, rel=1e-9)
  assert float(big.value) == pytest.approx(float(unit.value) * 1e30, rel=1e-9)
  np.testing.assert_allclose(np.asarray(big.primal_plan), np.asarray(unit.primal_plan),
                             atol=1e-7)


def _scaled_like_unscaled(dtype, regs, tol, atol):
  """C and gamma multiplied by the same s: every regularizer here is gamma times
  a function of the plan (gamma <t, log t>, gamma / 2 ||t||^2, gamma Psi(t) with
  at most k nonzeros), so the objective is s times the unscaled one and the
  optimal plan is the same; `solve` (L-BFGS) reaches it at s = 1e30 and 1e-28.

  Each plan is compared with the float64 optimum of the unscaled problem, not
  with the unscaled solve in the same dtype: two float32 solves each within tol
  of the optimum can differ by twice that, by how the CPU rounds."""
  a, b, cost = np.full(4, 0.25, dtype), np.full(3, 1 / 3, dtype), C.astype(dtype)
  for reg in regs:
    with jax.enable_x64(True):
      best = ot.solve(np.full(4, 0.25), np.full(3, 1 / 3), C, reg, tol=1e-12)
      best_plan, best_value = np.asarray(best.plan), float(best.value)
    for s in (1.0, 1e30, 1e-28):
      out = ot.solve(a, b, (cost * s).astype(dtype),
                     jax.tree_util.tree_map(lambda g, s=s: g * s, reg), tol=tol)
      assert out.reason() == "converged", (reg, s)
      np.testing.assert_allclose(np.asarray(out.plan), best_plan, atol=atol)
      assert float(out.value) == pytest.approx(best_value * s, rel=atol)


def test_c_and_gamma_scaled_together_give_the_unscaled_plan_in_float64():
  # k = 3 does not bind here (the plan has at most 3 nonzeros per column).
  _scaled_like_unscaled(np.float64, (ot.SquaredL2(0.1), ot.NegEntropy(0.1),
                                     ot.SparsityConstrained(3, 0.1)), tol=1e-10, atol=1e-8)


@pytest.mark.float32
def test_c_and_gamma_scaled_together_give_the_unscaled_plan_in_float32():
  _scaled_like_unscaled(np.float32, (ot.SparsityConstrained(3, 0.1),), tol=1e-5, atol=2e-5)
