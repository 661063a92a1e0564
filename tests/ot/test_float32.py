"""float32 solves reach the float64 optimum.

The small problem below has a row of constant cost, so the semi-dual is linear
along a stretch from alpha = 0 on: the gradient does not change between the first
two L-BFGS iterates except by float32 rounding. That rounding once passed for
curvature and scaled the next step by ~1e7, where the k-sparse projection loses
all precision (the plan came out zero and the value 1.7e9).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot import ot

C = np.array([[0., 1., 2.], [1., 0., 1.], [2., 1., 0.], [0.5, 0.5, 0.5]])
A = np.full(4, 0.25)
B = np.full(3, 1 / 3)

REGULARIZERS = {
    "sparse_k2_gamma0.1": ot.SparsityConstrained(k=2, gamma=0.1),
    "sparse_k2_gamma1": ot.SparsityConstrained(k=2, gamma=1.0),
    "l2_gamma0.1": ot.SquaredL2(gamma=0.1),
    "kl_gamma0.1": ot.NegEntropy(gamma=0.1),
}


def _solve(dtype, reg, formulation):
  return ot.solve(jnp.asarray(A, dtype), jnp.asarray(B, dtype), jnp.asarray(C, dtype), reg,
                  formulation=formulation, solver="lbfgs")


@pytest.mark.float32
@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
@pytest.mark.parametrize("name", sorted(REGULARIZERS))
def test_float32_reaches_the_float64_value(name, formulation):
  reg = REGULARIZERS[name]
  with jax.enable_x64(True):
    ref = _solve(jnp.float64, reg, formulation)
    ref_value, ref_plan = float(ref.value), np.asarray(ref.plan)
  res = _solve(jnp.float32, reg, formulation)
  assert res.plan.dtype == jnp.float32
  np.testing.assert_allclose(float(res.value), ref_value, rtol=1e-4)
  # The plan carries the whole mass, as the float64 one does.
  np.testing.assert_allclose(np.asarray(res.plan).sum(), ref_plan.sum(), rtol=1e-3)
