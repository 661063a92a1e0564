"""`ot.squared_k_support_norm` (Psi, ot/ksupport.py) against bisection on its
definition, and Psi as the biconjugate of the sparsity-constrained regularizer."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot import ot

_squared_k_support_norm = jax.jit(ot.squared_k_support_norm, static_argnames=("k", "axis"))
_conj_simplex = jax.jit(lambda reg, s, b, axis: reg.conj_simplex(s, b, axis), static_argnums=3)


def _psi_lambda(z, k):
  """lambda* = min(1, z / theta) of Psi's definition for z = |t|, theta by bisection
  on sum_i lambda_i = k."""
  lo, hi = 0.0, z.sum() / k
  for _ in range(200):
    th = 0.5 * (lo + hi)
    if np.minimum(1, z / th).sum() > k:
      lo = th
    else:
      hi = th
  return np.minimum(1, z / hi)


def brute_psi(t, k):
  """1/2 min sum t_i^2 / lambda_i, sum lambda = k, 0 < lambda <= 1, by bisection on
  the KKT form lambda_i = min(1, |t_i| / theta)."""
  z = np.abs(t)
  if np.count_nonzero(z) <= k:
    return 0.5 * z @ z
  lam = _psi_lambda(z, k)
  nz = z > 0
  return 0.5 * np.sum(z[nz] ** 2 / lam[nz])


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_squared_k_support_norm_against_bisection(k):
  rng = np.random.RandomState(k)
  for trial in range(8):
    t = rng.randn(6) * rng.rand(6)
    if trial % 3 == 0:
      t[:2] = 0.0  # zeros
    if trial % 4 == 1:
      t[3] = t[1]  # ties
    got = float(_squared_k_support_norm(jnp.asarray(t), k))
    np.testing.assert_allclose(got, brute_psi(t, k), rtol=1e-9, atol=1e-14)
  # k = 1: 1/2 ||t||_1^2; k >= m or ||t||_0 <= k: 1/2 ||t||^2.
  t = rng.randn(6)
  np.testing.assert_allclose(float(_squared_k_support_norm(jnp.asarray(t), 1)),
                             0.5 * np.abs(t).sum() ** 2)
  np.testing.assert_allclose(float(_squared_k_support_norm(jnp.asarray(t), 6)), 0.5 * t @ t)
  t[k:] = 0.0
  np.testing.assert_allclose(float(_squared_k_support_norm(jnp.asarray(t), k)), 0.5 * t @ t)


def psi_gradient(t, k):
  """t / lambda* with lambda* the minimiser in Psi's definition (by bisection)."""
  z = np.abs(t)
  return t / _psi_lambda(z, k)


def test_psi_is_the_biconjugate_on_the_simplex():
  """Omega**_b = Psi on b*simplex (Proposition 3, biconjugates): <s, t> - Omega*_b(s) <= Psi(t)
  for every s, with equality at s = grad Psi(t)."""
  rng = np.random.RandomState(5)
  k, gamma = 2, 1.0
  reg = ot.SparsityConstrained(k=k, gamma=gamma)
  for b in (1.0, 0.3):
    t = np.abs(rng.randn(5)) + 0.05
    t *= b / t.sum()
    psi = float(_squared_k_support_norm(jnp.asarray(t), k))
    S = rng.randn(5, 2000) * 2
    vals, _, _ = _conj_simplex(reg, jnp.asarray(S), jnp.asarray(np.full((2000,), b)), 0)
    assert np.all(t @ S - np.asarray(vals) <= psi + 1e-12)
    s_star = psi_gradient(t, k)
    v_star, t_star, _ = _conj_simplex(reg, jnp.asarray(s_star[:, None]), jnp.asarray([b]), 0)
    np.testing.assert_allclose(t @ s_star - float(np.asarray(v_star)[0]), psi, rtol=1e-8)
