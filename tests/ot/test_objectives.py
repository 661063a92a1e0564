"""Hand-written gradients and the Danskin loss against finite differences."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import dual_objective, problem, semi_dual_objective
from vmoe_sparse_ot import ot

# Jitted (regularizers are pytrees: gamma a traced leaf, k static): one
# program per regularizer instead of one per primitive eagerly, and the finite
# differences' many calls reuse it.
semi_dual_value_and_grad = jax.jit(ot.semi_dual_value_and_grad)
dual_value_and_grad = jax.jit(ot.dual_value_and_grad)
conj_simplex = jax.jit(lambda reg, s, b: reg.conj_simplex(s, b, axis=0))

REGS = [ot.SparsityConstrained(k=2, gamma=0.3), ot.SparsityConstrained(k=1, gamma=0.5),
        ot.SquaredL2(0.3), ot.NegEntropy(0.2)]


def fd_grad(f, x, h=1e-6):
  g = np.zeros_like(x)
  for i in range(len(x)):
    e = np.zeros_like(x)
    e[i] = h
    g[i] = (f(x + e) - f(x - e)) / (2 * h)
  return g


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


@pytest.mark.parametrize("reg", REGS[:1] + REGS[2:], ids=repr)
def test_conjugate_derivative_in_b(reg):
  rng = np.random.RandomState(2)
  s = jnp.asarray(rng.randn(6, 3))
  b = np.array([0.2, 0.5, 1.3])
  _, _, db = conj_simplex(reg, s, jnp.asarray(b))
  f = lambda bb: float(np.sum(conj_simplex(reg, s, jnp.asarray(bb))[0]))
  np.testing.assert_allclose(np.asarray(db), fd_grad(f, b), atol=1e-6)


def test_danskin_loss_gradients_match_finite_differences():
  """dS/dC = T*, dS/da = alpha* (along mass-preserving directions), no unrolling."""
  a, b, C = problem(6, 4, seed=3, uniform=False)
  reg = ot.SquaredL2(0.5)  # smooth and strictly convex: S is differentiable
  kw = dict(tol=1e-11, max_iter=2000)
  loss = lambda a_, b_, C_: ot.semi_dual_loss(a_, b_, C_, reg, **kw)
  ga, gb, gC = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(a), jnp.asarray(b), jnp.asarray(C))
  res = ot.solve(a, b, C, reg, **kw)
  np.testing.assert_allclose(np.asarray(gC), np.asarray(res.plan), atol=1e-12)
  ga, gb, gC = (np.asarray(g) for g in (ga, gb, gC))   # (products below in numpy)
  h = 1e-5
  rng = np.random.RandomState(4)
  for _ in range(2):
    dC = rng.randn(*C.shape)
    fd = (float(loss(a, b, C + h * dC)) - float(loss(a, b, C - h * dC))) / (2 * h)
    assert float(np.sum(gC * dC)) == pytest.approx(fd, rel=1e-5, abs=1e-9)
    da = rng.randn(6)
    da -= da.mean()  # keep sum(a) = sum(b)
    fd = (float(loss(a + h * da, b, C)) - float(loss(a - h * da, b, C))) / (2 * h)
    assert float(np.dot(ga, da)) == pytest.approx(fd, rel=1e-5, abs=1e-9)
    db = rng.randn(4)
    db -= db.mean()
    fd = (float(loss(a, b + h * db, C)) - float(loss(a, b - h * db, C))) / (2 * h)
    assert float(np.dot(gb, db)) == pytest.approx(fd, rel=1e-5, abs=1e-9)
  # Under jit too, and for the sparsity-constrained regularizer.
  reg_k = ot.SparsityConstrained(k=2, gamma=0.5)
  gC_k = jax.jit(jax.grad(lambda C_: ot.semi_dual_loss(a, b, C_, reg_k, **kw)))(C)
  np.testing.assert_allclose(np.asarray(gC_k), np.asarray(ot.solve(a, b, C, reg_k, **kw).plan),
                             atol=1e-12)
  assert np.all((np.asarray(gC_k) > 0).sum(0) <= 2)
