"""Every bad input raises ValueError naming the argument, before compiling."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot import ot

A = np.full(3, 1 / 3)
B = np.full(2, 1 / 2)
C = np.ones((3, 2))
REG = ot.SparsityConstrained(k=1, gamma=1.0)


@pytest.mark.parametrize("kwargs,name", [
    (dict(a=np.ones((3, 1)) / 3), "a"),
    (dict(C=np.ones((2, 3))), "C"),
    (dict(b=np.full(3, 1 / 3)), "C"),
    (dict(a=np.array([0.5, 0.6, -0.1])), "a"),
    (dict(b=np.array([1.5, -0.5])), "b"),
    (dict(C=np.array([[1.0, np.nan], [1, 1], [1, 1]])), "C"),
    (dict(C=np.array([[1.0, -np.inf], [1, 1], [1, 1]])), "C"),
    (dict(a=np.array([np.inf, 0, 0])), "a"),
    (dict(b=np.array([0.5, 0.6])), "same total mass"),
    (dict(formulation="primal"), "formulation"),
    (dict(solver="sgd"), "solver"),
    (dict(max_iter=0), "max_iter"),
    (dict(max_iter=2.5), "max_iter"),
    (dict(tol=-1.0), "tol"),
    (dict(solver=ot.LBFGS(ftol=-1.0)), "LBFGS.ftol"),   # each field: test_solver_options.py
    (dict(regularizer="l2"), "regularizer"),
    (dict(init=np.zeros(5)), "init"),
])
def test_solve_rejects_bad_input(kwargs, name):
  args = dict(a=A, b=B, C=C, regularizer=REG)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    ot.solve(**args)


def test_checks_run_before_compiling_and_values_only_when_concrete():
  # Shape errors even under jit (tracers have shapes).
  with pytest.raises(ValueError, match="C"):
    jax.jit(lambda c: ot.solve(A, B, c, REG).value)(jnp.ones((2, 3)))
  # Value checks are skipped for tracers.
  out = jax.jit(lambda c: ot.solve(A, B, c, REG, max_iter=5, tol=0.0).value)(
      jnp.full((3, 2), jnp.nan))
  assert np.isnan(float(out))


def test_k_larger_than_m_is_squared_l2_not_a_crash():
  res = ot.solve(A, B, np.arange(6.0).reshape(3, 2), ot.SparsityConstrained(k=10, gamma=1.0))
  ref = ot.solve(A, B, np.arange(6.0).reshape(3, 2), ot.SquaredL2(1.0))
  np.testing.assert_allclose(np.asarray(res.plan), np.asarray(ref.plan))
