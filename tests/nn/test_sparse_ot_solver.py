"""The router's batched semi-dual Adam equals jax.vmap(ot.solve) (same iterates)."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn.sparse_ot_solver import sparse_semi_dual_adam, top_k_members


def test_top_k_members_matches_ot_top_k_mask_with_ties():
  rng = np.random.default_rng(0)
  u = jnp.asarray(rng.integers(0, 5, size=(12, 40)).astype(np.float32))   # many ties
  u = u.at[:, 0].set(-jnp.inf).at[:3, 1].set(7.0)
  for k in (1, 3, 5, 12):
    want, _ = ot.top_k_mask(u, k, axis=0) if k < 12 else (jnp.ones(u.shape, bool), None)
    got = jax.jit(top_k_members, static_argnums=1)(u, k)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("g,m,n,k", [(3, 16, 4, 6), (2, 8, 3, 1)])
def test_matches_vmapped_ot_solve_in_float64(g, m, n, k):
  with jax.enable_x64(True):
    key = jax.random.key(0)
    C = jax.random.uniform(key, (g, m, n), jnp.float64)
    a = jnp.ones((g, m), jnp.float64)
    b = jnp.full((g, n), m / n, jnp.float64)
    reg = ot.SparsityConstrained(k=k, gamma=0.5)
    want = jax.jit(jax.vmap(lambda c, a, b: ot.solve(
        a, b, c, reg, formulation="semi_dual", solver="adam", max_iter=50,
        learning_rate=1e-2, tol=0.0).plan))(C, a, b)
    got = jax.jit(lambda c, a, b: sparse_semi_dual_adam(c, a, b, k, 0.5, 50, 1e-2))(C, a, b)
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, want, atol=1e-10)
    assert ((np.asarray(got) > 0).sum(axis=1) <= k).all()
