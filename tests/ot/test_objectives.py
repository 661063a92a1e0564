"""The objectives (ot/objectives.py): the semi-dual's and the dual's hand-written
gradients against finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import dual_objective, fd_grad, problem, semi_dual_objective
from vmoe_sparse_ot import ot

# Jitted (regularizers are pytrees: gamma a traced leaf, k static): one
# program per regularizer instead of one per primitive eagerly, and the finite
# differences' many calls reuse it.
semi_dual_value_and_grad = jax.jit(ot.semi_dual_value_and_grad)
dual_value_and_grad = jax.jit(ot.dual_value_and_grad)

REGS = [ot.SparsityConstrained(k=2, gamma=0.3), ot.SparsityConstrained(k=1, gamma=0.5),
        ot.SquaredL2(0.3), ot.NegEntropy(0.2)]


@pytest.mark.parametrize("reg", REGS, ids=repr)
def test_semi_dual_and_dual_gradients_match_finite_differences(reg):
  a, b, C = problem(7, 5, seed=0, uniform=False)
  rng = np.random.RandomState(1)
  alpha, beta = rng.randn(7) * 0.3, rng.randn(5) * 0.3
  _, g, _ = semi_dual_value_and_grad(jnp.asarray(alpha), a, b, C, reg)
  f = lambda x: float(semi_dual_objective(jnp.asarray(x), a, b, C, reg))
  np.testing.assert_allclose(np.asarray(g), fd_grad(f, alpha), atol=1e-7)
  _, (ga, gb), _ = dual_value_and_grad(jnp.asarray(alpha), jnp.asarray(beta), a, b, C, reg)
  fa = lambda x: float(dual_objective(jnp.asarray(x), jnp.asarray(beta), a, b, C, reg))
  fb = lambda x: float(dual_objective(jnp.asarray(alpha), jnp.asarray(x), a, b, C, reg))
  np.testing.assert_allclose(np.asarray(ga), fd_grad(fa, alpha), atol=1e-7)
  np.testing.assert_allclose(np.asarray(gb), fd_grad(fb, beta), atol=1e-7)
