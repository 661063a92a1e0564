"""Scale- and dtype-aware tolerances, zero-mass marginals, and the stop reason."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import problem
from vmoe_sparse_ot import ot

REG = ot.SparsityConstrained(k=3, gamma=0.1)


def _row_col_errors(res, a, b):
  P = np.asarray(res.plan, np.float64)
  return np.abs(P.sum(1) - a).max(), np.abs(P.sum(0) - b).max()


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16])
def test_half_precision_marginals_are_accepted_and_solved_in_float32(dtype):
  a, b, C = problem(12, 8, seed=1, uniform=False)
  a16, b16, C16 = (np.asarray(x).astype(dtype) for x in (a, b, C))
  # Rounded to 3 digits the masses differ by more than float32's tolerance.
  assert float(np.sum(a16.astype(np.float64))) != float(np.sum(b16.astype(np.float64)))
  res = ot.solve(a16, b16, C16, REG, tol=1e-4)
  assert res.plan.dtype == jnp.float32
  assert res.reason() in ("converged", "objective_tol", "stalled")
  ref = ot.solve(a, b, C, REG, tol=1e-9)
  np.testing.assert_allclose(np.asarray(res.plan), np.asarray(ref.plan), atol=2e-3)


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
def test_masses_differing_within_tolerance_are_solved_as_b_rescaled_to_a(formulation):
  """Unequal masses make the (semi-)dual unbounded along alpha + c; b is rescaled."""
  a, b, C = problem(10, 7, seed=4, uniform=False)
  b_off = b * (1 + 5e-7)                     # accepted: float64's mass rtol is 1e-6
  res = ot.solve(a, b_off, C, REG, formulation=formulation, tol=1e-8, max_iter=3000)
  # Unscaled, the gradient a - T 1 sums to sum(a) - sum(T) = -5e-7 at every
  # column-feasible plan: no iterate could reach max |grad| <= 1e-8.
  assert res.reason() == "converged"
  ref = ot.solve(a, b_off * (a.sum() / b_off.sum()), C, REG, formulation=formulation,
                 tol=1e-8, max_iter=3000)
  # Both converged to marginals within 1e-8: the same optimum to that accuracy
  # (their iterates differ by the rounding of the rescaling).
  assert float(res.value) == pytest.approx(float(ref.value), rel=1e-10)
  np.testing.assert_allclose(np.asarray(res.plan), np.asarray(ref.plan), atol=1e-7)
  np.testing.assert_allclose(np.asarray(res.plan).sum(0), b_off * (a.sum() / b_off.sum()),
                             atol=1e-7)


def test_mass_check_scales_with_dtype():
  a, b, C = problem(6, 4)
  with pytest.raises(ValueError, match="same total mass"):
    ot.solve(a, b * (1 + 1e-3), C, REG)                    # float64: 1e-3 is a mismatch
  with pytest.raises(ValueError, match="same total mass"):
    ot.solve(a.astype(np.float16), (b * 1.1).astype(np.float16), C, REG)
  with pytest.raises(ValueError, match="positive total mass"):
    ot.solve(np.zeros(6), np.zeros(4), C, REG)


@pytest.mark.parametrize("scale", [1e-20, 1e-6, 1e3])
def test_tolerance_is_relative_to_the_mass(scale):
  """converged means the marginals hold to tol * mass, at every scale."""
  a, b, C = problem(10, 7, seed=2, uniform=False)
  res = ot.solve(a * scale, b * scale, C, ot.SquaredL2(0.1 * scale ** -1), tol=1e-7,
                 max_iter=3000)
  # gamma / scale: the same problem in mass units, whose plan is scale * the unit plan.
  unit = ot.solve(a, b, C, ot.SquaredL2(0.1), tol=1e-9, max_iter=3000)
  assert res.reason() == "converged"
  assert bool(res.converged)
  err = max(_row_col_errors(res, a * scale, b * scale))
  assert err <= 1e-7 * scale * 1.0000001
  np.testing.assert_allclose(np.asarray(res.plan) / scale, np.asarray(unit.plan), atol=1e-6)


def test_tiny_mass_is_not_reported_converged_when_it_is_not():
  """Mass 1e-20 with gamma = 0.1 is an almost unregularised problem: whatever the
  solver reaches, `converged` only when the marginals hold relative to the mass."""
  a, b, C = problem(10, 7, seed=2, uniform=False)
  res = ot.solve(a * 1e-20, b * 1e-20, C, REG, max_iter=200)
  err = max(_row_col_errors(res, a * 1e-20, b * 1e-20))
  assert bool(res.converged) == (err <= 1e-6 * 1e-20 * 1.0000001)
  if not res.converged:
    assert res.reason() in ("max_iter", "stalled", "objective_tol")


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
@pytest.mark.parametrize("solver", ["lbfgs", "adam"])
def test_zero_mass_rows_and_columns_are_solved(formulation, solver):
  # (k = 6 does not bind here: a smooth optimum the marginal tolerance can reach.)
  reg = ot.SparsityConstrained(k=6, gamma=0.1)
  a, b, C = problem(12, 8, seed=3, uniform=False)
  a[[2, 5]] = 0
  b[[1]] = 0
  a, b = a / a.sum(), b / b.sum()
  res = ot.solve(a, b, C, reg, formulation=formulation, solver=solver, tol=1e-6,
                 max_iter=5000)
  assert res.reason() == "converged", res.reason()
  row, col = _row_col_errors(res, a, b)
  assert max(row, col) <= 1.0000001e-6
  P = np.asarray(res.plan)
  assert (P[[2, 5]] == 0).all() and (P[:, 1] == 0).all()
  # Same optimum as the problem without those rows and columns.
  keep_r, keep_c = a > 0, b > 0
  sub = ot.solve(a[keep_r], b[keep_c], C[keep_r][:, keep_c], reg, formulation=formulation,
                 tol=1e-9, max_iter=5000)
  assert float(res.value) == pytest.approx(float(sub.value), rel=1e-5)


def test_status_names_each_stop():
  a, b, C = problem(10, 7, seed=4)
  assert ot.STATUS == ("converged", "objective_tol", "max_iter", "stalled", "fixed_iter",
                       "interior_point")
  assert ot.solve(a, b, C, REG, tol=1e-6).reason() == "converged"
  assert ot.solve(a, b, C, REG, tol=1e-12, max_iter=3).reason() == "max_iter"
  assert ot.solve(a, b, C, REG, solver="adam", tol=0.0, max_iter=5).reason() == "fixed_iter"
  assert ot.solve(a, b, C, REG, tol=1e-14, solver=ot.LBFGS(rtol=1e-3),
                  max_iter=500).reason() == "objective_tol"
  # A tolerance below float64 rounding of the marginals: the line search runs
  # out of measurable progress first.
  res = ot.solve(a, b, C, REG, tol=1e-17, solver=ot.LBFGS(rtol=0.0), max_iter=5000)
  assert res.reason() == "stalled" and not bool(res.converged)
  # Under vmap: one status per problem.
  out = jax.vmap(lambda c: ot.solve(a, b, c, REG, tol=1e-6).status)(np.stack([C, 2 * C]))
  np.testing.assert_array_equal(np.asarray(out), 0)
