"""ot/results.py: the plan's marginal errors, b matched to a's mass, the
semi-dual scored at given potentials, the k-sparse feasibility check and
`OTResult.reason`, on hand-computed values."""
import warnings

import numpy as np
import pytest

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import results


def test_plan_errors_are_l1_errors_relative_to_the_mass():
  T = np.array([[1.0, 0.0], [0.0, 0.5]])
  a, b = np.array([1.0, 1.0]), np.array([0.5, 1.5])
  # rows: |1 - 1| + |0.5 - 1| = 0.5; columns: |1 - 0.5| + |0.5 - 1.5| = 1.5; mass 2.
  row, col, feasible = results.plan_errors(T, a, b, xp=np)
  assert (row, col, bool(feasible)) == (0.25, 0.75, False)
  row, col, feasible = results.plan_errors(np.array([[0.5, 0.5], [0.0, 1.0]]), a, b, xp=np)
  assert (row, col, bool(feasible)) == (0.0, 0.0, True)
  # On the host, b is first matched to a's mass (b * 2 / 4 here).
  row, col, feasible = results.host_plan_errors(T, a, 2 * b)
  assert (float(row), float(col), bool(feasible)) == (0.25, 0.75, False)
  assert row.dtype == T.dtype


def test_matched_mass_rescales_b_to_a_and_leaves_zero_mass_alone():
  a = np.array([1.0, 1.0])
  np.testing.assert_array_equal(np.asarray(results.matched_mass(np.array([1.0, 3.0]), a)),
                                [0.5, 1.5])
  np.testing.assert_array_equal(np.asarray(results.matched_mass(np.zeros(2), a)), [0.0, 0.0])


def test_semi_dual_at_a_hand_point():
  """m = 2 rows of mass 1/2, one column of mass 1, C = 0, SquaredL2(1). At
  alpha = (1, 0) the column's conjugate max_{t in simplex} <alpha, t> - |t|^2 / 2
  is attained at t = (1, 0) (on a support of both rows alpha_i - t_i = tau
  would need t1 - t2 = 1, so t2 = 0): value 1 - 1/2, S = <alpha, a> - 1/2 = 0;
  the plan's primal value is 1/2."""
  a, b, C = np.array([0.5, 0.5]), np.array([1.0]), np.zeros((2, 1))
  value, T, beta, primal = results.semi_dual_at(np.array([1.0, 0.0]), a, b, C, ot.SquaredL2(1.0))
  assert float(value) == pytest.approx(0.0, abs=1e-15)
  np.testing.assert_allclose(np.asarray(T), [[1.0], [0.0]], atol=1e-15)
  assert float(primal) == pytest.approx(0.5, rel=1e-15)
  # beta = dS/db = -tau, tau the threshold: t1 = alpha_1 - tau = 1 gives tau = 0.
  assert float(beta[0]) == pytest.approx(0.0, abs=1e-15)
  # At alpha = 0 the mass splits evenly: conjugate -1/4, S = 1/4 = the primal (gap 0).
  value, T, _, primal = results.semi_dual_at(np.zeros(2), a, b, C, ot.SquaredL2(1.0))
  assert float(value) == pytest.approx(0.25) and float(primal) == pytest.approx(0.25)
  np.testing.assert_allclose(np.asarray(T), [[0.5], [0.5]])


def test_k_sparse_feasibility_counts_the_rows_with_mass():
  C = np.zeros((4, 3))
  reg = ot.SparsityConstrained(1, 1.0)
  with pytest.warns(ot.KSparseInfeasibleWarning, match=r"n k = 3 x 1 = 3 < m = 4 rows;"):
    results.check_k_sparse_feasible(np.full(4, 0.25), C, reg, "warn")
  with pytest.raises(ValueError, match=r"infeasible='raise': .*< 3 rows with mass \(m = 4\)"):
    results.check_k_sparse_feasible(np.array([0.5, 0.25, 0.25, 0.0]), C[:, :2], reg, "raise")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    # Zero-mass rows need no entry: three rows with mass fit one per column.
    results.check_k_sparse_feasible(np.array([1 / 3, 1 / 3, 1 / 3, 0.0]), C, reg, "warn")
    results.check_k_sparse_feasible(np.full(4, 0.25), C, reg, "ignore")
    results.check_k_sparse_feasible(np.full(4, 0.25), C, ot.SquaredL2(1.0), "warn")
  with pytest.raises(ValueError, match="infeasible must be one of"):
    results.check_k_sparse_feasible(np.full(4, 0.25), C, reg, "yes")


def test_reason_names_the_status_and_says_what_is_certified():
  res = ot.OTResult(plan=None, value=2.0, alpha=None, beta=None, num_iter=3, grad_norm=0.1,
                    converged=False, duality_gap=1e-3, num_evals=4, trace=None, status=2,
                    row_error=0.25, col_error=0.0, plan_feasible=False)
  assert res.reason() == "max_iter"
  assert res.reason(full=True) == ("max_iter: value not converged; plan infeasible "
                                   "(row_error 0.25, col_error 0)")
  res = res._replace(status=5, duality_gap=2e-12, primal_plan=np.eye(2),
                     primal_nnz_per_column=np.array([1, 1]))
  assert res.reason(full=True) == (
      "interior_point: value certified (duality_gap 1e-12 of it); plan infeasible "
      "(row_error 0.25, col_error 0); primal_plan is a coupling (nonzeros per column [1, 1])")
  assert res._replace(row_error=None).reason(full=True) == "interior_point"
