"""ot.LBFGS / ot.Adam: `solve`'s per-method options, their checks, and the
deprecated flat keywords (same results, bit for bit, with a warning)."""
import inspect
import warnings

import numpy as np
import pytest

from tests.ot.helpers import problem
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import solver_options


def _same(x, y):
  for field in ("alpha", "beta", "plan", "value", "num_iter", "num_evals", "status"):
    np.testing.assert_array_equal(np.asarray(getattr(x, field)), np.asarray(getattr(y, field)))


def test_solve_takes_at_most_eight_options_besides_the_problem():
  params = list(inspect.signature(ot.solve).parameters)
  assert params[:4] == ["a", "b", "C", "regularizer"]
  assert len(params) - 4 <= 8
  assert not set(solver_options.FLAT_OPTIONS) & set(params)


def test_flat_keywords_warn_and_equal_the_objects_bit_for_bit():
  a, b, C = problem(10, 8, seed=7)
  reg = ot.SparsityConstrained(k=3, gamma=0.1)
  new = ot.solve(a, b, C, reg, solver=ot.LBFGS(history=5, ftol=1e-7, patience=2, rtol=1e-7))
  with pytest.warns(DeprecationWarning) as caught:
    old = ot.solve(a, b, C, reg, history=5, ftol=1e-7, patience=2, rtol=1e-7)
  assert [str(w.message) for w in caught] == [
      "ot.solve(history=..., ftol=..., patience=..., rtol=...) is deprecated: use "
      "solver=ot.LBFGS(history=..., ftol=..., patience=..., rtol=...)"]
  _same(new, old)
  # history is read: another memory size takes other steps.
  other = ot.solve(a, b, C, reg, solver=ot.LBFGS(history=10, ftol=1e-7, patience=2, rtol=1e-7))
  assert int(other.num_evals) != int(new.num_evals) or not np.array_equal(
      np.asarray(other.alpha), np.asarray(new.alpha))
  new = ot.solve(a, b, C, reg, solver=ot.Adam(learning_rate=0.05), max_iter=30, tol=0.0)
  with pytest.warns(DeprecationWarning, match=r"solve\(learning_rate=\.\.\.\) is deprecated: "
                    r"use solver=ot\.Adam\(learning_rate=\.\.\.\)"):
    old = ot.solve(a, b, C, reg, solver="adam", learning_rate=0.05, max_iter=30, tol=0.0)
  _same(new, old)
  # An object given with flat keywords keeps its own fields, as it did.
  with pytest.warns(DeprecationWarning):
    kept = ot.solve(a, b, C, reg, solver=ot.Adam(learning_rate=0.05), max_iter=30, tol=0.0,
                    learning_rate=0.5)
  _same(new, kept)


def test_names_mean_the_default_objects_and_no_warning():
  assert solver_options.resolve("lbfgs") == ot.LBFGS(10, None, 0.0, 1)
  assert solver_options.resolve("adam") == ot.Adam(1e-2)
  a, b, C = problem(6, 4, seed=1)
  reg = ot.SquaredL2(0.5)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    _same(ot.solve(a, b, C, reg, solver="adam", max_iter=5, tol=0.0),
          ot.solve(a, b, C, reg, solver=ot.Adam(), max_iter=5, tol=0.0))


@pytest.mark.parametrize("options,field", [
    (ot.LBFGS(history=0), "LBFGS.history"),
    (ot.LBFGS(ftol=-1.0), "LBFGS.ftol"),
    (ot.LBFGS(history=2.0), "LBFGS.history"),
    (ot.LBFGS(rtol=float("inf")), "LBFGS.rtol"),
    (ot.LBFGS(ftol=True), "LBFGS.ftol"),
    (ot.LBFGS(patience=-1), "LBFGS.patience"),
    (ot.Adam(learning_rate=-0.1), "Adam.learning_rate"),
    (ot.Adam(learning_rate=float("nan")), "Adam.learning_rate"),
])
def test_bad_fields_raise_naming_the_field(options, field):
  a, b, C = problem(4, 3, seed=0)
  with pytest.raises(ValueError, match=field.replace(".", r"\.")):
    ot.solve(a, b, C, ot.SquaredL2(1.0), solver=options)


def test_bad_flat_keywords_still_raise_naming_the_field():
  a, b, C = problem(4, 3, seed=0)
  with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"LBFGS\.patience"):
    ot.solve(a, b, C, ot.SquaredL2(1.0), patience=0)
  with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=r"Adam\.learning_rate"):
    ot.solve(a, b, C, ot.SquaredL2(1.0), learning_rate=0.0)


def test_checked_returns_python_numbers():
  checked = ot.LBFGS(history=np.int64(4), rtol=np.float32(0.5), ftol=0, patience=2).checked()
  assert checked == (4, 0.5, 0.0, 2)
  assert [type(x) for x in checked] == [int, float, float, int]
  assert type(ot.Adam(np.float64(0.25)).checked().learning_rate) is float


def test_the_wrapper_leaves_warnings_pointing_at_the_caller():
  """`accepts_flat_options` adds a frame: solve's own warnings still name the
  line that called ot.solve."""
  C = np.ones((3, 2))
  with pytest.warns(ot.KSparseInfeasibleWarning) as caught:
    ot.solve(np.full(3, 1 / 3), np.full(2, 1 / 2), C, ot.SparsityConstrained(k=1, gamma=1.0),
             max_iter=2)
  assert caught[0].filename == __file__
