"""`ot.sinkhorn`, the log-domain Sinkhorn: against the NegEntropy solve and POT,
fixed iterations under jit and vmap, costs of any sign, argument checks."""
import jax
import numpy as np
import pytest

from tests.ot.helpers import pot, problem
from vmoe_sparse_ot import ot

TIGHT = dict(tol=1e-10, max_iter=2000)
A = np.full(3, 1 / 3)
B = np.full(2, 1 / 2)
C = np.ones((3, 2))


def test_sinkhorn_matches_negentropy_solve_and_pot():
  a, b, C = problem(10, 8, seed=5, uniform=False)
  eps = 0.05
  sk = ot.sinkhorn(a, b, C, eps, tol=1e-12, max_iter=10000)
  assert bool(sk.converged)
  res = ot.solve(a, b, C, ot.NegEntropy(eps), formulation="dual", **TIGHT)
  assert float(sk.value) == pytest.approx(float(res.value), rel=1e-8)
  np.testing.assert_allclose(np.asarray(sk.plan), np.asarray(res.plan), atol=1e-8)
  P = pot().sinkhorn(a, b, C, eps, method="sinkhorn_log", stopThr=1e-13, numItermax=10000)
  np.testing.assert_allclose(np.asarray(sk.plan), P, atol=1e-9)


def test_sinkhorn_fixed_iterations_under_jit_and_vmap_with_negative_costs():
  rng = np.random.RandomState(6)
  logits = rng.randn(4, 16, 4)    # numpy, and so the checks: eager jnp ops compile each
  a, b = np.full((16,), 1 / 16), np.full((4,), 1 / 4)

  @jax.jit
  def route(lg):
    return jax.vmap(lambda c: ot.sinkhorn(a, b, -c, 0.5, max_iter=200, tol=0.0))(lg)

  out = route(logits)
  assert out.plan.shape == (4, 16, 4)
  np.testing.assert_array_equal(np.asarray(out.num_iter), 200)
  plans = np.asarray(out.plan)
  for g in range(4):
    one = ot.sinkhorn(a, b, -logits[g] + 10.0, 0.5, max_iter=200, tol=0.0)  # shift: C >= 0
    np.testing.assert_allclose(plans[g], np.asarray(one.plan), atol=1e-10)
  np.testing.assert_allclose(plans.sum(1), 0.25, atol=1e-12)


def test_sinkhorn_accepts_negative_costs():
  a, b, C = problem(10, 8, seed=5, uniform=False)
  C = C - 0.6                   # entries in [-0.6, 0.4]
  s0 = ot.sinkhorn(a, b, C, 0.05, tol=1e-12, max_iter=20000)
  s1 = ot.sinkhorn(a, b, C + 7.0, 0.05, tol=1e-12, max_iter=20000)
  np.testing.assert_allclose(np.asarray(s0.plan), np.asarray(s1.plan), atol=1e-9)


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
