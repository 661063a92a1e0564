"""ot.batched_semi_dual_adam (the router's solver) equals jax.vmap(ot.solve) (same iterates)."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from tests.ot.helpers import force_kernel, simplex_threshold
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import batched as sos
from vmoe_sparse_ot.ot import selection

sparse_semi_dual_adam = ot.batched_semi_dual_adam


def top_k_members(u, k):
  """The batched solver's selection: the tie-aware threshold stats, then members."""
  return sos._members_with_ties(u, k, sos._top_k_stats(u, k, jnp.zeros((1, u.shape[1]), u.dtype)))


# Called eagerly, each function compiles every primitive inside it as its own
# program; jitted once here (k and axis static), one program per shape.
_top_k_members = jax.jit(top_k_members, static_argnums=1)
_top_k_mask = jax.jit(ot.top_k_mask, static_argnames=("k", "axis"))
_distinct_top_values = jax.jit(selection.distinct_top_values, static_argnums=1)
_top_k_stats = jax.jit(sos._top_k_stats, static_argnums=1)
_stats = jax.jit(sos._stats, static_argnums=2)


def test_top_k_members_matches_ot_top_k_mask_with_ties():
  rng = np.random.default_rng(0)
  u = rng.integers(0, 5, size=(12, 40)).astype(np.float32)               # many ties
  u[:, 0], u[:3, 1] = -np.inf, 7.0
  u = jnp.asarray(u)
  for k in (1, 3, 5, 11):
    want, _ = _top_k_mask(u, k, axis=0)
    got = _top_k_members(u, k)
    np.testing.assert_array_equal(got, want)


def _reference_plans(C, a, b, k, gamma):
  reg = ot.SparsityConstrained(k=k, gamma=gamma)
  return jax.jit(jax.vmap(lambda c, a, b: ot.solve(
      a, b, c, reg, formulation="semi_dual", solver=ot.Adam(learning_rate=1e-2),
      max_iter=50, tol=0.0, init=jnp.zeros_like(a)).plan))(C, a, b)


def _has_boundary_tie(u, k):
  """Whether some column's k-th and (k+1)-th largest entries are equal."""
  s = -np.sort(-np.asarray(u), axis=-2)
  return bool((s[..., k - 1, :] == s[..., k, :]).any())


@pytest.mark.parametrize("g,m,n,k", [(3, 16, 4, 6), (2, 8, 3, 1), (2, 12, 3, 5), (1, 7, 2, 3)])
def test_matches_vmapped_ot_solve_in_float64(g, m, n, k):
  with jax.enable_x64(True):
    key = jax.random.key(0)
    C = jax.random.uniform(key, (g, m, n), jnp.float64)
    a = np.ones((g, m))                         # numpy: jnp.ones compiles a program
    b = np.full((g, n), m / n)
    want = _reference_plans(C, a, b, k, 0.5)
    got = jax.jit(lambda c, a, b: sparse_semi_dual_adam(c, a, b, k, 0.5, 50, 1e-2))(C, a, b)
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(got, want, atol=1e-10)
    assert ((np.asarray(got) > 0).sum(axis=1) <= k).all()


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_matches_vmapped_ot_solve_with_ties_in_float64(gamma):
  # Quantised costs and duplicated tokens: equal values inside and across the
  # top-k boundary of a column (duplicate image patches give such ties).
  rng = np.random.default_rng(1)
  C = rng.integers(0, 4, size=(3, 16, 4)) / 4.0
  C[:, 8:12] = C[:, 0:4]
  C[2, :, 1] = 0.5                                       # one column all tied
  k = 5
  assert _has_boundary_tie(-C, k)
  with jax.enable_x64(True):
    C = jnp.asarray(C, jnp.float64)
    a = np.ones(C.shape[:2])                    # numpy: jnp.ones compiles a program
    b = np.full((3, 4), 4.0)
    want = _reference_plans(C, a, b, k, gamma)
    got = jax.jit(lambda c, a, b: sparse_semi_dual_adam(c, a, b, k, gamma, 50, 1e-2))(C, a, b)
    np.testing.assert_allclose(got, want, atol=1e-10)
    assert ((np.asarray(got) > 0).sum(axis=1) <= k).all()


def test_distinct_top_values():
  u = jnp.asarray([[3., 1.], [5., 1.], [3., 1.], [-1., 1.], [4., 0.]])
  got = _distinct_top_values(u, 4)
  np.testing.assert_array_equal(got, [[5., 1.], [4., 0.], [3., -np.inf], [-1., -np.inf]])


def test_no_tie_and_tie_paths_agree_on_distinct_values():
  # The threshold with counts (any ties) must reduce to the sorted-prefix rule.
  rng = np.random.default_rng(2)
  u = jnp.asarray(rng.normal(size=(12, 30)).astype(np.float32))
  b = jnp.asarray(rng.uniform(0.1, 3.0, size=(1, 30)).astype(np.float32))
  k = 5
  values = _distinct_top_values(u, k)
  counts = np.broadcast_to(np.arange(1, k + 1, dtype=u.dtype)[:, None], values.shape)
  no_ties = np.asarray(_top_k_stats(u, k, b))            # the sorted-prefix branch
  # (Equal up to rounding: XLA may turn the division by a constant r into a product.)
  np.testing.assert_allclose(_stats(values, counts, k, b), no_ties, rtol=1e-6)
  # And tau is the simplex threshold of the k largest entries.
  member = np.asarray(_top_k_members(u, k))
  want = simplex_threshold(u, b, axis=0, mask=jnp.asarray(member))
  np.testing.assert_allclose(no_ties[0:1], want, rtol=1e-6)


@pytest.mark.parametrize("k", [20, 70])
def test_large_k_radix_path_matches_vmapped_ot_solve_in_float64(k, monkeypatch):
  """k at and above the crossover: the radix selection serves both solvers."""
  with jax.enable_x64(True):
    if k == 20:
      force_kernel(monkeypatch, "radix")
    assert selection.uses_radix(k, 80, jnp.float64)
    rng = np.random.default_rng(3)
    C = jnp.asarray(rng.integers(0, 6, size=(2, 80, 3)) / 6.0)      # ties too
    a = np.ones((2, 80))                        # numpy: jnp.ones compiles a program
    b = np.full((2, 3), 80 / 3)
    want = _reference_plans(C, a, b, k, 0.5)
    got = jax.jit(lambda c, a, b: sparse_semi_dual_adam(c, a, b, k, 0.5, 50, 1e-2))(C, a, b)
    np.testing.assert_allclose(got, want, atol=1e-10)
    assert ((np.asarray(got) > 0).sum(axis=1) <= k).all()
