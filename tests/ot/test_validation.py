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


@pytest.mark.parametrize("ctor,name", [
    (lambda: ot.SparsityConstrained(k=0), "k"),
    (lambda: ot.SparsityConstrained(k=-2), "k"),
    (lambda: ot.SparsityConstrained(k=1.5), "k"),
    (lambda: ot.SparsityConstrained(k=2, gamma=0.0), "gamma"),
    (lambda: ot.SparsityConstrained(k=2, gamma=-1.0), "gamma"),
    (lambda: ot.SquaredL2(gamma=0), "gamma"),
    (lambda: ot.NegEntropy(gamma=float("nan")), "gamma"),
])
def test_regularizers_reject_bad_parameters(ctor, name):
  with pytest.raises(ValueError, match=name):
    ctor()


@pytest.mark.parametrize("kwargs,name", [
    (dict(epsilon=0.0), "epsilon"),
    (dict(C=np.array([[1.0, np.inf], [1, 1], [1, 1]])), "C"),
    (dict(a=np.array([0.5, 0.6, -0.1])), "a"),
    (dict(b=np.array([0.5, 0.6])), "same total mass"),
    (dict(C=np.ones((3, 3))), "C"),
    (dict(max_iter=0), "max_iter"),
])
def test_sinkhorn_rejects_bad_input(kwargs, name):
  args = dict(a=A, b=B, C=C, epsilon=1.0)
  args.update(kwargs)
  with pytest.raises(ValueError, match=name):
    ot.sinkhorn(**args)


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
