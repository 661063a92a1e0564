"""Every public array-to-array map of `ot` under differentiation (issue 55).

The thresholds' loops (Michelot's, the radix selection, the loop over the
binding rows) carry closed-form JVPs, so reverse mode works where JAX cannot
transpose a `while_loop`. Each map is checked in both modes, under jit, in the
layouts it accepts (the first, the last and a middle axis), against its
closed-form Jacobian where it has a short one, and always against central
finite differences (float64, at random points: away from kinks). The solvers
whose loops stop on data-dependent tests refuse differentiation in one line.

Each check is one jitted program (forward mode, reverse mode and the
differences together), with several maps per program: compiling is most of
the time here.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from tests.ot.helpers import force_kernel
from vmoe_sparse_ot import ot

H = 1e-6   # finite-difference step: the maps are piecewise smooth, float64


def _flat(out):
  """The float leaves of a map's output, raveled into one vector."""
  leaves = [x for x in jax.tree_util.tree_leaves(out) if jnp.issubdtype(x.dtype, jnp.floating)]
  return ravel_pytree(leaves)[0]


@functools.partial(jax.jit, static_argnums=0)
def _derivatives(f, x, v, w):
  """(f(x), J v by forward mode, J^T w by reverse mode, J v by differences),
  J the Jacobian of f's flat float output."""
  g = lambda x: _flat(f(x))
  _, jv = jax.jvp(g, (x,), (v,))
  wt = jax.grad(lambda x: jnp.vdot(w, g(x)))(x)
  return f(x), jv, wt, (g(x + H * v) - g(x - H * v)) / (2 * H)


def check(f, x, jvp=None, vjp=None, seed=0):
  """Checks f's derivatives at x and returns f(x): forward mode against
  finite differences, reverse mode against forward (<w, J v> = <J^T w, v>),
  and both against the closed forms where given: jvp(out, v) -> J v (any
  shape: compared raveled) and vjp(out, w) -> J^T w (w shaped like f's flat
  output; default jvp(out, w): J symmetric)."""
  rng = np.random.default_rng(seed)
  x = jnp.asarray(x)
  v = rng.normal(size=x.shape)
  size = jax.eval_shape(lambda x: _flat(f(x)), x).shape
  w = rng.normal(size=size)
  out, jv, wt, fd = _derivatives(f, x, jnp.asarray(v), jnp.asarray(w))
  np.testing.assert_allclose(jv, fd, atol=1e-7 * max(1.0, float(jnp.abs(fd).max())))
  np.testing.assert_allclose(np.vdot(wt, v), np.vdot(w, jv), rtol=1e-9, atol=1e-12)
  if jvp is not None:
    np.testing.assert_allclose(jv, np.ravel(jvp(out, v)), atol=1e-10)
    np.testing.assert_allclose(np.ravel(wt), np.ravel((vjp or jvp)(out, w)), atol=1e-10)
  return out


def support_projection(t, d, axis, db=0.0):
  """The simplex projection's Jacobian applied to d (shaped like t): on the
  support S of t (t > 0), d minus (its sum over S - db) / |S|; zero off S."""
  s = np.asarray(t) > 0
  d = np.asarray(d).reshape(s.shape)
  count = s.sum(axis=axis, keepdims=True)
  return np.where(s, d - ((d * s).sum(axis=axis, keepdims=True) - db) / count, 0)


def split(w, *shapes):
  """w (flat) cut into arrays of these shapes."""
  sizes = np.cumsum([int(np.prod(s)) for s in shapes])[:-1]
  return [p.reshape(s) for p, s in zip(np.split(np.asarray(w), sizes), shapes)]


# --- The input -------------------------------------------------------

def test_projection_simplex_gradient_of_the_report_is_the_closed_form():
  z = jnp.array([[0.3, 1.2, -0.5], [2.0, 1.9, 0.1]])
  loss = lambda z: jnp.sum(ot.projection_simplex(z) ** 2)
  # p = (0.05, 0.95, 0), (0.55, 0.45, 0); grad = J^T 2p, J = I - 1 1^T / 2 on S.
  p = np.array([[0.05, 0.95, 0], [0.55, 0.45, 0]])
  want = np.array([[-0.9, 0.9, 0], [0.1, -0.1, 0]])
  np.testing.assert_allclose(support_projection(p, 2 * p, axis=-1), want, atol=1e-12)
  np.testing.assert_allclose(jax.grad(loss)(z), want, atol=1e-12)
  np.testing.assert_allclose(jax.jit(jax.grad(loss))(z), want, atol=1e-12)
  jac = np.zeros((2, 3, 2, 3))
  jac[0, :, 0, :] = [[0.5, -0.5, 0], [-0.5, 0.5, 0], [0, 0, 0]]
  jac[1, :, 1, :] = jac[0, :, 0, :]
  np.testing.assert_allclose(jax.jacfwd(ot.projection_simplex)(z), jac, atol=1e-12)
  np.testing.assert_allclose(jax.jacrev(ot.projection_simplex)(z), jac, atol=1e-12)


# --- Projections, in every layout and on every kernel ------------------------

def _masses(shape, axis, scale=1.0):
  """b per slice, keepdims: small masses (few entries, k free) and large ones
  (most entries of a slice: k binds)."""
  reduced = list(shape)
  reduced[axis] = 1
  size = int(np.prod(reduced))
  return np.resize([0.5, 30.0, 2.0], size).reshape(reduced) * scale


def _check_projections(x, b, axis, k):
  """projection_simplex, projection_sparse_simplex and simplex_threshold in x
  and in b, against the support Jacobian: dt = P_S(dx) + 1_S db / |S|,
  d tau = (sum_S dx - db) / |S|."""
  n = x.size
  shapes = (x.shape, x.shape, b.shape)

  def maps(xb):
    x_, b_ = xb[:n].reshape(x.shape), xb[n:].reshape(b.shape)
    return (ot.projection_simplex(x_, b_, axis), ot.projection_sparse_simplex(x_, k, b_, axis),
            ot.simplex_threshold(x_, b_, axis))

  def jvp(out, v):
    t, tk, tau = (np.asarray(o) for o in out)
    dx, db = v[:n].reshape(x.shape), v[n:].reshape(b.shape)
    s = x > tau
    count = s.sum(axis=axis, keepdims=True)
    return np.concatenate([support_projection(t, dx, axis, db).ravel(),
                           support_projection(tk, dx, axis, db).ravel(),
                           (((dx * s).sum(axis=axis, keepdims=True) - db) / count).ravel()])

  def vjp(out, w):
    t, tk, tau = (np.asarray(o) for o in out)
    wt, wk, wtau = split(w, *shapes)
    s = x > tau
    count = s.sum(axis=axis, keepdims=True)
    # P_S is symmetric; the b column of the projections' Jacobian is 1_S / |S|.
    dx = support_projection(t, wt, axis) + support_projection(tk, wk, axis) + s * wtau / count
    db = sum(((w_ * (t_ > 0)).sum(axis=axis, keepdims=True) / (t_ > 0).sum(axis, keepdims=True))
             for w_, t_ in ((wt, t), (wk, tk))) - wtau / count
    return np.concatenate([dx.ravel(), db.ravel()])

  out = check(maps, np.concatenate([x.ravel(), b.ravel()]), jvp, vjp)
  assert int((np.asarray(out[1]) > 0).sum(axis=axis).max()) <= k
  return out


# (shape, axis, k): the compact top-k (k = 2) along the first axis, k >= m
# along the last, Michelot folded (minor axis, m >= 64) and a middle axis.
@pytest.mark.parametrize("shape,axis,k", [((7, 5), 0, 2), ((4, 6), -1, 6), ((2, 64), 1, 3),
                                          ((3, 9, 2), 1, 3)])
def test_simplex_projections_and_threshold_have_the_support_jacobian(shape, axis, k):
  x = np.random.default_rng(1).normal(size=shape)
  _check_projections(x, _masses(shape, axis), axis % len(shape), k)


@pytest.mark.parametrize("axis", [0, 1])
def test_radix_selection_paths_differentiate(axis, monkeypatch):
  """On the radix kernel: the loop over binding rows (2-D, minor axis) and
  the batched cond (the other axis), with k binding on some slices only."""
  force_kernel(monkeypatch, "radix")
  shape = (6, 12) if axis == 1 else (12, 6)
  x = np.random.default_rng(5).normal(size=shape)
  out = _check_projections(x, _masses(shape, axis, scale=0.1), axis, 4)
  counts = (np.asarray(out[1]) > 0).sum(axis=axis)
  assert (counts == 4).any() and (counts < 4).any()


@pytest.mark.parametrize("axis", [0, 1])
def test_nonneg_projections_and_selected_values(axis):
  """[topk(x)]_+ and [x]_+: dx where kept and positive. Selected values (of
  top_k and top_k_mask, k = 3 by passes and 6 on the radix kernel's sort):
  dx at the selected positions; under the float64 packed keys top_k_mask's
  values differentiated to 0 before."""
  x = np.random.default_rng(6).normal(size=(9, 8) if axis == 0 else (8, 9))
  rows = x.shape[axis]
  mask = np.asarray(ot.top_k_mask(jnp.asarray(x), 3, axis)[0])
  idx = [np.asarray(ot.top_k(jnp.asarray(x), k, axis)[1]) for k in (3, 6)]

  def maps(x):
    return (ot.projection_sparse_nonneg(x, 3, axis), ot.projection_nonneg(x),
            ot.top_k(x, 3, axis)[0], ot.top_k_mask(x, 3, axis)[1],
            ot.top_k(x, 6, axis)[0], ot.top_k_mask(x, 6, axis)[1])

  def jvp(out, d):
    picks = [np.take_along_axis(d, i, axis=axis) for i in idx for _ in range(2)]
    return np.concatenate([np.where(mask & (x > 0), d, 0).ravel(),
                           np.where(x > 0, d, 0).ravel()] + [p.ravel() for p in picks])

  def vjp(out, w):
    sel = [i.shape for i in idx for _ in range(2)]
    w_sparse, w_plain, *w_sel = split(w, x.shape, x.shape, *sel)
    dx = np.where(mask & (x > 0), w_sparse, 0) + np.where(x > 0, w_plain, 0)
    for ws, i in zip(w_sel, [i for i in idx for _ in range(2)]):
      scattered = np.zeros_like(x)
      np.put_along_axis(scattered, i, ws, axis=axis)
      dx = dx + scattered
    return dx

  assert idx[0].shape[axis] == 3 and rows > 6
  check(maps, x, jvp, vjp)
  # A mask is piecewise constant: what flows through it is x where it holds.
  grad = jax.grad(lambda x: jnp.sum(jnp.where(ot.top_k_mask(x, 3, axis)[0], x, 0)))(x)
  np.testing.assert_array_equal(grad, mask.astype(float))


# --- Regularizers ------------------------------------------------------------

REGS = [ot.SparsityConstrained(2, 0.7), ot.SparsityConstrained(1, 0.7), ot.SquaredL2(0.7),
        ot.NegEntropy(0.7)]


def _check_regularizer(reg, axis, m=6):
  """Every method of reg in (s, b, gamma) by differences and both modes, and
  Danskin: d Omega*_b(s) = <t, ds> + (d Omega*_b / db) db for the maximiser t
  and the derivative in b it returns; d Omega*_+(s) = <p, ds>."""
  shape = (m, 4) if axis == 0 else (4, m)
  rng = np.random.default_rng(7)
  s = rng.normal(size=shape)
  b = rng.uniform(0.3, 1.5, size=4) * (m / 6)
  sparse = isinstance(reg, ot.SparsityConstrained) and reg.k < m
  n = s.size

  def methods(x):
    s_, b_ = x[:n].reshape(shape), x[n:n + 4]
    r = jax.tree_util.tree_map(lambda _: x[-1], reg)      # gamma, a pytree leaf
    out = [r.conj_simplex(s_, b_, axis), r.conj_plus(s_, axis),
           r.primal(jnp.abs(s_) + 0.1, axis)]
    if sparse:
      out += [r.conj_simplex_sparse(s_, b_, axis), r.conj_plus_sparse(s_, axis)]
    return out

  x = np.concatenate([s.ravel(), b, [reg.gamma]])
  out = check(methods, x)
  (_, t, dval_db), (_, p) = out[0], out[1]
  values = jax.jit(lambda x: (jnp.sum(methods(x)[0][0]), jnp.sum(methods(x)[1][0])))
  danskin = jax.jit(jax.jacrev(lambda x: jnp.stack(values(x))))(x)
  np.testing.assert_allclose(danskin[0, :n], np.ravel(t), atol=1e-10)
  np.testing.assert_allclose(danskin[0, n:n + 4], dval_db, atol=1e-10)
  np.testing.assert_allclose(danskin[1, :n], np.ravel(p), atol=1e-10)


@pytest.mark.parametrize("reg", REGS, ids=repr)
@pytest.mark.parametrize("axis", [0, 1])
def test_regularizers_conjugates_and_their_maximisers(reg, axis):
  _check_regularizer(reg, axis)


def test_regularizer_on_the_radix_kernel(monkeypatch):
  """k = 4 of 12 on the radix kernel (the dense large-k path of the
  conjugates), in the semi-dual's (n, m) layout."""
  force_kernel(monkeypatch, "radix")
  _check_regularizer(ot.SparsityConstrained(4, 0.7), axis=1, m=12)


# --- Objectives and the rest -------------------------------------------------

@pytest.mark.parametrize("reg", [ot.SparsityConstrained(2, 0.5), ot.SquaredL2(0.5),
                                 ot.NegEntropy(0.5)], ids=repr)
def test_objectives_derivatives(reg):
  """By differences and both modes in (alpha, beta, a, b, C); and the
  hand-written gradients: dS/dalpha = a - T 1, dS/dC = T, dS/da = alpha,
  dD/d(alpha, beta) = the marginal residuals, dD/dC = T."""
  rng = np.random.default_rng(8)
  m, n = 7, 4
  a = rng.uniform(0.5, 1.5, m)
  b = rng.uniform(0.5, 1.5, n)
  b *= a.sum() / b.sum()
  C = rng.uniform(size=(m, n))
  alpha, beta = rng.normal(size=m) * 0.3, rng.normal(size=n) * 0.3
  x = np.concatenate([alpha, beta, a, b, C.ravel()])

  def unpack(x):
    return x[:m], x[m:m + n], x[m + n:2 * m + n], x[2 * m + n:2 * m + 2 * n], \
        x[2 * m + 2 * n:].reshape(m, n)

  def maps(x):
    alpha, beta, a, b, C = unpack(x)
    plan = ot.plan_from_semi_dual(alpha, b, C, reg)
    return (ot.semi_dual_value_and_grad(alpha, a, b, C, reg),
            ot.dual_value_and_grad(alpha, beta, a, b, C, reg), plan,
            ot.plan_from_dual(alpha, beta, C, reg), ot.primal_objective(plan + 0.05, C, reg),
            ot.marginal_errors(plan + 0.05, a, b), ot.c_transform_start(b, C, reg))

  out = check(maps, x)
  (_, g, T), (_, (ga, gb), T_dual) = out[0], out[1]

  def objectives(x):
    alpha, beta, a, b, C = unpack(x)
    return jnp.stack([ot.semi_dual_objective(alpha, a, b, C, reg),
                      ot.dual_objective(alpha, beta, a, b, C, reg)])

  jac = jax.jit(jax.jacrev(objectives))(x)
  semi, dual = (unpack(row) for row in np.asarray(jac))
  for got, want in zip((semi[0], semi[2], semi[4], dual[0], dual[1], dual[4]),
                       (g, alpha, T, ga, gb, T_dual)):
    np.testing.assert_allclose(got, want, atol=1e-10)


@pytest.mark.parametrize("axis", [0, -1])
def test_squared_k_support_norm_derivative(axis):
  t = np.random.default_rng(9).normal(size=(6, 5))
  check(lambda t: ot.squared_k_support_norm(t, 2, axis), t)
  # k >= m: 1/2 ||t||^2, gradient t.
  check(lambda t: ot.squared_k_support_norm(t, 9, axis), t,
        jvp=lambda out, d: (t * d).sum(axis), vjp=lambda out, w: t * np.expand_dims(w, axis))


# --- Solvers -----------------------------------------------------------------

A, B = np.full(4, 0.25), np.full(3, 1 / 3)
COST = np.random.default_rng(10).uniform(size=(4, 3))
REFUSED = {
    "ot.solve": lambda C: ot.solve(A, B, C, ot.SquaredL2(0.5)).value,
    "ot.solve_interior_point": lambda C: ot.solve_interior_point(
        A, B, C, ot.SparsityConstrained(2, 0.5)).value,
    "ot.sinkhorn with tol > 0": lambda C: ot.sinkhorn(A, B, C, 0.5).value,
    "ot.batched_semi_dual_adam_candidates": lambda C: ot.batched_semi_dual_adam_candidates(
        jnp.tile(C[None], (1, 3, 1)), np.ones((1, 12)), np.full((1, 3), 4.0), 2, 0.5, 5, 0.1),
    "ot.batched_semi_dual_adam_pallas": lambda C: ot.batched_semi_dual_adam_pallas(
        C[None], A[None], B[None], 2, 0.5, 3, 0.1),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_solvers_with_data_dependent_stops_refuse_in_one_line(name):
  f = REFUSED[name]
  for mode in (jax.grad, jax.jacfwd):
    with pytest.raises(ValueError, match="^" + name + " cannot be differentiated") as info:
      mode(lambda C: jnp.sum(f(C)))(jnp.asarray(COST))
    assert "\n" not in str(info.value)


def test_the_guard_under_jit_and_vmap_over_numpy_arguments():
  """A vmap over a numpy array inside jit (the sparse_ot router's reference
  path: its marginals are numpy) handed the guard a numpy constant, which
  the custom JVP refused; not differentiated, it is the identity."""
  from vmoe_sparse_ot.ot import validation
  guard = lambda *x: validation.not_differentiable("no", x)
  run = jax.jit(lambda y: jax.vmap(guard)(np.ones((2, 3)), y))
  for got in run(jnp.full((2, 3), 2.0)):
    assert got.shape == (2, 3)
  with pytest.raises(ValueError) as info:
    jax.grad(lambda y: jnp.sum(run(y)[1]))(jnp.ones((2, 3)))
  # Under jit JAX appends a note on its filtered traceback; the line is ours.
  assert str(info.value).splitlines()[0] == "no"


def test_fixed_iteration_solvers_differentiate_through_their_steps():
  """sinkhorn(tol=0) and batched_semi_dual_adam: unrolled loops, checked by
  differences (the plans of a fixed number of steps, smooth in C here)."""
  check(lambda C: ot.sinkhorn(A, B, C, 0.5, max_iter=20, tol=0.0), COST)
  cost = np.stack([COST, 2 * COST])
  check(lambda C: ot.batched_semi_dual_adam(C, np.tile(A, (2, 1)), np.tile(B, (2, 1)), 2, 0.5,
                                            10, 0.05), cost)
