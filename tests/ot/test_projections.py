"""Projections and the sparsity-constrained conjugate against brute force (the top-k
selection: test_selection.py; Table 1's conjugates: test_regularizers.py; Psi: test_ksupport.py)."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import densify, force_kernel, simplex_threshold, supports
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import projections

# Called eagerly, each function compiles every primitive inside it as its own
# program; jitted once here (k and axis static; regularizers are pytrees with
# gamma a leaf and k static), each compiles one program per shape, shared by
# the parametrized cases.
_conj_simplex = jax.jit(lambda reg, s, b, axis: reg.conj_simplex(s, b, axis), static_argnums=3)
_conj_plus = jax.jit(lambda reg, s, axis: reg.conj_plus(s, axis), static_argnums=2)
_projection_simplex = jax.jit(ot.projection_simplex, static_argnames="axis")
_projection_sparse_simplex = jax.jit(ot.projection_sparse_simplex, static_argnames=("k", "axis"))
_projection_sparse_nonneg = jax.jit(ot.projection_sparse_nonneg, static_argnames=("k", "axis"))
_folded_lower_bound = jax.jit(projections._folded_lower_bound, static_argnums=2)
_sparse_simplex_topk = jax.jit(projections.sparse_simplex_topk, static_argnames=("k", "axis"))
# Only under force_kernel(monkeypatch, "radix"): the kernel is chosen when
# tracing and jit's cache does not see the patched tables, so these programs
# must not be shared with unpatched calls (hence lambdas, not the functions:
# jit shares its cache between wrappers of the same function).
_radix_threshold = jax.jit(
    lambda x, k, b, axis: projections.sparse_simplex_threshold(x, k, b, axis),
    static_argnums=(1, 3))
_radix_parts = jax.jit(lambda x, k, b, axis: projections.sparse_simplex_parts(x, k, b, axis),
                       static_argnums=(1, 3))


def np_proj_simplex(v, b):
  """Sort-based projection onto {t >= 0, sum t = b} (Duchi et al. 2008)."""
  u = np.sort(v)[::-1]
  css = np.cumsum(u) - b
  rho = np.nonzero(u - css / np.arange(1, len(v) + 1) > 0)[0][-1]
  return np.maximum(v - css[rho] / (rho + 1), 0)


def brute_sparse_simplex(s, k, b, gamma=1.0):
  """argmax / max of <s, t> - gamma/2 ||t||^2 over t in b*simplex, ||t||_0 <= k."""
  best, best_t = -np.inf, None
  for S in supports(len(s), k):
    S = list(S)
    t = np.zeros_like(s)
    t[S] = np_proj_simplex(s[S] / gamma, b)
    val = s @ t - 0.5 * gamma * t @ t
    if val > best + 1e-12:
      best, best_t = val, t
  return best, best_t


def brute_sparse_nonneg(s, k, gamma=1.0):
  best, best_t = 0.0, np.zeros_like(s)
  for S in supports(len(s), k):
    S = list(S)
    t = np.zeros_like(s)
    t[S] = np.maximum(s[S], 0) / gamma
    val = s @ t - 0.5 * gamma * t @ t
    if val > best + 1e-12:
      best, best_t = val, t
  return best, best_t


@pytest.mark.parametrize("m,k", [(4, 1), (5, 2), (6, 3), (6, 6)])
def test_sparse_simplex_projection_is_the_brute_force_argmax(m, k):
  rng = np.random.RandomState(m * 10 + k)
  for trial in range(5):
    s = rng.randn(m)
    b = [1.0, 0.3, 2.0][trial % 3]
    for gamma in (1.0, 0.2):
      val_bf, t_bf = brute_sparse_simplex(s, k, b, gamma)
      reg = ot.SparsityConstrained(k=k, gamma=gamma)
      val, t, _ = _conj_simplex(reg, jnp.asarray(s[:, None]), jnp.asarray([b]), 0)
      np.testing.assert_allclose(np.asarray(t)[:, 0], t_bf, atol=1e-12)
      np.testing.assert_allclose(float(np.asarray(val)[0]), val_bf, rtol=1e-12, atol=1e-12)
    # The projection itself (gamma = 1): nearest point of the non-convex set.
    p = _projection_sparse_simplex(jnp.asarray(s), k, b)
    _, t_bf = brute_sparse_simplex(s, k, b)
    np.testing.assert_allclose(np.asarray(p), t_bf, atol=1e-12)
    assert np.count_nonzero(np.asarray(p)) <= k


@pytest.mark.parametrize("m,k", [(4, 1), (5, 2), (6, 4)])
def test_sparse_nonneg_projection_and_conj_plus_brute_force(m, k):
  rng = np.random.RandomState(m + k)
  for _ in range(5):
    s = rng.randn(m)
    for gamma in (1.0, 0.5):
      val_bf, t_bf = brute_sparse_nonneg(s, k, gamma)
      reg = ot.SparsityConstrained(k=k, gamma=gamma)
      val, t = _conj_plus(reg, jnp.asarray(s[:, None]), 0)
      np.testing.assert_allclose(np.asarray(t)[:, 0], t_bf, atol=1e-12)
      np.testing.assert_allclose(float(np.asarray(val)[0]), val_bf, atol=1e-12)
    np.testing.assert_allclose(
        np.asarray(_projection_sparse_nonneg(jnp.asarray(s), k)),
        brute_sparse_nonneg(s, k)[1], atol=1e-12)


def test_k_at_least_m_is_squared_l2():
  rng = np.random.RandomState(1)
  S = jnp.asarray(rng.randn(5, 4))
  b = np.asarray([0.1, 0.2, 0.3, 0.4])
  for k in (5, 9):
    v, t, d = _conj_simplex(ot.SparsityConstrained(k=k, gamma=0.3), S, b, 0)
    v2, t2, d2 = _conj_simplex(ot.SquaredL2(0.3), S, b, 0)
    np.testing.assert_allclose(np.asarray(v), np.asarray(v2))
    np.testing.assert_allclose(np.asarray(t), np.asarray(t2))
  p = _projection_sparse_simplex(S, 7, b, axis=0)
  expect = np.stack([np_proj_simplex(np.asarray(S)[:, j], float(b[j])) for j in range(4)], 1)
  np.testing.assert_allclose(np.asarray(p), expect, atol=1e-12)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_compact_sparse_simplex_equals_the_dense_projection(k):
  """sparse_simplex_topk's k entries, densified, are the top-k sparsemax; its
  tau, count and sum_sq are the threshold and active-set statistics."""
  rng = np.random.RandomState(k)
  x = rng.randn(9, 5)
  b = rng.rand(5) + 0.2
  sp = _sparse_simplex_topk(jnp.asarray(x), k, jnp.asarray(b), axis=0)
  dense = np.asarray(densify(sp.values, sp.indices, 9, axis=0))
  count, sum_sq, tau = np.asarray(sp.count), np.asarray(sp.sum_sq), np.asarray(sp.tau)
  for j in range(5):
    _, t_ref = brute_sparse_simplex(x[:, j], k, b[j])
    np.testing.assert_allclose(dense[:, j], t_ref, atol=1e-12)
    act = t_ref > 0
    assert float(count[0, j]) == act.sum()
    np.testing.assert_allclose(float(sum_sq[0, j]), np.sum(x[act, j] ** 2), rtol=1e-12)
    np.testing.assert_allclose(x[act, j] - float(tau[0, j]), t_ref[act], atol=1e-12)


def test_projections_are_batched_over_leading_axes():
  rng = np.random.RandomState(3)
  x = rng.randn(2, 3, 6)
  b = rng.rand(2, 3) + 0.1
  p = np.asarray(_projection_sparse_simplex(jnp.asarray(x), 2, jnp.asarray(b)))
  ps = np.asarray(_projection_simplex(jnp.asarray(x), jnp.asarray(b)))
  pn = np.asarray(_projection_sparse_nonneg(jnp.asarray(x), 2))
  for i, j in itertools.product(range(2), range(3)):
    np.testing.assert_allclose(np.asarray(p[i, j]), brute_sparse_simplex(x[i, j], 2, b[i, j])[1],
                               atol=1e-12)
    np.testing.assert_allclose(np.asarray(ps[i, j]), np_proj_simplex(x[i, j], b[i, j]),
                               atol=1e-12)
    np.testing.assert_allclose(np.asarray(pn[i, j]), brute_sparse_nonneg(x[i, j], 2)[1])


def test_simplex_threshold_with_mask_and_zero_mass():
  x = np.asarray([[0.5, -1.0, 2.0, 0.1]]).T
  tau = np.asarray(simplex_threshold(jnp.asarray(x), jnp.asarray([0.0]), axis=0))
  assert float(np.sum(np.maximum(x - tau, 0))) == pytest.approx(0.0, abs=1e-12)
  v, t, _ = _conj_simplex(ot.SparsityConstrained(2, 1.0), jnp.asarray(x), jnp.asarray([0.0]), 0)
  np.testing.assert_allclose(np.asarray(t), 0.0)
  assert float(np.asarray(v)[0]) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", [64, 67, 4099])
def test_folded_michelot_threshold_against_sorting(dtype, m):
  """Long rows along the minor axis start Michelot from the threshold of their
  folded quarter-maxima (recursively: several levels at 4099): it must be a
  lower bound, and the final threshold must be the sorting one. Supports
  from one entry to most of the row, masses 0 to 10, -inf entries, lengths
  that do not divide by 4."""
  assert m >= projections._FOLD_MIN
  rng = np.random.default_rng(m)
  x = rng.standard_normal((6, m)).astype(dtype)
  x[1] *= 100.0                                       # support of one or two entries
  x[2] = np.round(x[2])                               # ties
  x[3, ::3] = -np.inf
  b = np.array([1.0, 0.5, 2.0, 0.0, 10.0, 1e3], dtype)
  xj, bj = jnp.asarray(x), jnp.asarray(b[:, None])
  tau = np.asarray(simplex_threshold(xj, bj, axis=1))[:, 0]
  lower = np.asarray(_folded_lower_bound(xj, bj, 1))[:, 0]
  rtol = 1e-12 if dtype == np.float64 else 2e-6
  for i in range(6):
    row = x[i].astype(np.float64)
    finite = np.isfinite(row)
    want = np.zeros(m)
    if b[i] > 0:   # the sort-based reference needs b > 0 and finite entries
      want[finite] = np_proj_simplex(row[finite], float(b[i]))
    got = np.where(finite, np.maximum(row - tau[i], 0), 0)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * (1 + np.abs(row[finite]).max()),
                               err_msg=f"row {i}")
    assert lower[i] <= tau[i] + rtol * abs(tau[i]), (i, lower[i], tau[i])


def np_sparse_simplex(v, k, b):
  """Top-k sparsemax by sorting: the simplex projection of the k largest
  (lower index first among ties), zero elsewhere."""
  top = np.argsort(-v, kind="stable")[:k]
  t = np.zeros_like(v)
  t[top] = np_proj_simplex(v[top], b)
  return t


@pytest.mark.parametrize("binding", [False, True])
def test_dense_large_k_projection_with_and_without_a_binding_k(binding, monkeypatch):
  """The radix path's two branches: when no column's plain simplex support
  exceeds k the selection is skipped (the plain projection is the answer);
  when one does, all columns go through the selection, and columns that do not
  bind must come out the same as without it."""
  force_kernel(monkeypatch, "radix")
  rng = np.random.RandomState(7)
  m, k = 60, 6
  x = rng.randn(m, 4)
  b = np.array([0.05, 0.1, 0.2, 40.0 if binding else 0.3])   # b = 40: support ~ all of m
  tau, mask = _radix_threshold(jnp.asarray(x), k, jnp.asarray(b[None]), 0)
  plain = [np.sum(np_proj_simplex(x[:, j], b[j]) > 0) for j in range(4)]
  assert (max(plain) > k) == binding
  assert np.asarray(mask).all() != binding                    # skipped: all-True mask
  t = _radix_parts(jnp.asarray(x), k, jnp.asarray(b[None]), 0)[0]
  for j in range(4):
    np.testing.assert_allclose(np.asarray(t)[:, j], np_sparse_simplex(x[:, j], k, b[j]),
                               atol=1e-12)


@pytest.mark.parametrize("binding", ["one", "half"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", [pytest.param(jnp.float32, marks=pytest.mark.float32),
                                   jnp.float64])                 # float32: x64 off
def test_radix_path_binding_and_free_columns_against_sorting(dtype, axis, binding, monkeypatch):
  """The radix path along either axis (binary digits and two reductions along
  the major one, base-4 digits and variadic reductions along the minor one):
  columns where k binds (closed-form tau over the k largest), columns where it
  does not, ties at the k-th value (a value grid), against the sorted
  projection. Along the minor axis of an (n, m) array the binding columns are
  selected n / 4 (here 2 of 8) at a time, gathered: one chunk, half full
  ("one"), and two full chunks ("half")."""
  force_kernel(monkeypatch, "radix")
  rng = np.random.default_rng(5)
  m, k = 60, 6
  x = rng.normal(size=(m, 8))
  x[:, 5] = rng.integers(0, 4, size=m) / 4.0                  # ties at the k-th value
  b = np.array([0.05, 0.2, 0.3, 0.1, 0.5, 0.4, 0.15, 0.25])  # none binds ...
  b[{"one": [5], "half": [0, 3, 5, 7]}[binding]] = 30.0   # ... but these
  xj = jnp.asarray(x if axis == 0 else x.T, dtype)
  bj = jnp.asarray(b[None] if axis == 0 else b[:, None], dtype)
  t = _radix_parts(xj, k, bj, axis)[0]
  t = np.asarray(t, np.float64) if axis == 0 else np.asarray(t, np.float64).T
  atol = 1e-12 if dtype == jnp.float64 else 2e-5
  for j in range(8):
    np.testing.assert_allclose(t[:, j], np_sparse_simplex(x[:, j], k, b[j]), atol=atol)
    assert (t[:, j] > 0).sum() <= k


@pytest.mark.parametrize("k", [None, 6])
def test_forward_mode_through_the_variadic_reductions(k, monkeypatch):
  """jax.jvp along the minor axis (variadic reductions, custom JVP) equals
  the analytic derivative of the projection: on the support, the direction
  minus its mean over the support; zero elsewhere (and along the major axis,
  plain reductions, the same)."""
  force_kernel(monkeypatch, "radix")
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(5, 40)))
  dx = jnp.asarray(rng.normal(size=(5, 40)))
  b = jnp.asarray(rng.uniform(0.5, 3.0, size=(5, 1)))

  def project(z, axis):
    bb = b if axis == 1 else b.T
    if k is None:
      return jnp.maximum(z - ot.simplex_threshold(z, bb, axis=axis), 0)
    return projections.sparse_simplex_parts(z, k, bb, axis)[0]

  @jax.jit     # a new function: traced now, with the radix kernel
  def jvps(x, dx):
    t, d_minor = jax.jvp(lambda z: project(z, 1), (x,), (dx,))
    return t, d_minor, jax.jvp(lambda z: project(z, 0), (x.T,), (dx.T,))[1]

  t, d_minor, d_major = jvps(x, dx)
  active = np.asarray(t) > 0
  if k is not None:
    assert (active.sum(axis=1) <= k).all() and (active.sum(axis=1) == k).any()
  d = np.asarray(dx)
  mean = (d * active).sum(axis=1, keepdims=True) / active.sum(axis=1, keepdims=True)
  want = np.where(active, d - mean, 0)
  np.testing.assert_allclose(d_minor, want, atol=1e-12)
  np.testing.assert_allclose(np.asarray(d_major).T, want, atol=1e-12)
