"""The L-BFGS maximiser's internals against textbook references."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot.ot import optim

# Jitted as in the solver's loop (slot and head traced there too): one program
# each instead of one per primitive eagerly, shared by every case.
store_pair = jax.jit(optim._store_pair)
inverse_hessian_times = jax.jit(optim._lbfgs_inverse_hessian_times)


def _two_loop(g, pairs, gamma0):
  """Nocedal & Wright's two-loop recursion (Algorithm 7.4), pairs oldest first."""
  q = g.copy()
  alphas = []
  for s, y in reversed(pairs):
    a = (s @ q) / (s @ y)
    q -= a * y
    alphas.append(a)
  r = gamma0 * q
  for (s, y), a in zip(pairs, reversed(alphas)):
    r += s * (a - (y @ r) / (s @ y))
  return r


@pytest.mark.parametrize("num_pairs", [0, 1, 3, 5, 6, 13])
@pytest.mark.parametrize("seed", [0, 1])
def test_compact_inverse_hessian_equals_the_two_loop_recursion(num_pairs, seed):
  """Pairs stored one by one in the ring (history 5): partly filled, full, and
  wrapped around more than once; the product must equal the two-loop's on the
  newest `history` pairs."""
  rng = np.random.default_rng(seed)
  d, M = 12, 5
  A = rng.standard_normal((d, d))
  A = A @ A.T + d * np.eye(d)       # y = A s: curvature pairs with s.y > 0
  S, Y = jnp.zeros((M, d)), jnp.zeros((M, d))
  STY, YTY = jnp.zeros((M, M)), jnp.zeros((M, M))
  pairs = []
  for head in range(num_pairs):
    s = rng.standard_normal(d)
    y = A @ s
    pairs.append((s, y))
    S, Y, STY, YTY = store_pair(S, Y, STY, YTY, head % M, jnp.asarray(s),
                                       jnp.asarray(y), jnp.asarray(s @ y), jnp.asarray(True))
  # A pair that is not stored changes nothing.
  unchanged = store_pair(S, Y, STY, YTY, num_pairs % M, jnp.ones(d), jnp.ones(d),
                                jnp.asarray(float(d)), jnp.asarray(False))
  for new, old in zip(unchanged, (S, Y, STY, YTY)):
    np.testing.assert_array_equal(new, old)
  g = rng.standard_normal(d)
  gamma0 = 0.37
  got = inverse_hessian_times(jnp.asarray(g), S, Y, STY, YTY, jnp.asarray(gamma0),
                              jnp.asarray(num_pairs))
  want = _two_loop(g, pairs[-M:], gamma0)
  np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_lbfgs_maximises_a_concave_quadratic_exactly():
  """f(x) = -x^T A x / 2 + c^T x, d = 30 > history: the maximiser A^-1 c to 1e-7."""
  rng = np.random.default_rng(3)
  d = 30
  B = rng.standard_normal((d, d))
  A = jnp.asarray(B @ B.T / d + 0.1 * np.eye(d))
  c = jnp.asarray(rng.standard_normal(d))

  def fun(x):
    return -0.5 * x @ A @ x + c @ x, c - A @ x, None

  st = jax.jit(lambda x0: optim.lbfgs(fun, x0, max_iter=500, tol=1e-8, history=5))(jnp.zeros(d))
  assert int(st.status) == optim.CONVERGED
  np.testing.assert_allclose(st.x, np.linalg.solve(np.asarray(A), np.asarray(c)), rtol=1e-7,
                             atol=1e-7)
