"""Euclidean projections used by the OT conjugates, batched over leading axes.

All functions act along one `axis` of `x` (default: the last) and broadcast over
the others, so an (m, n) matrix of columns is projected with `axis=0`.

The top-k sparse projections select with `ot.selection` (no sort); after the
selection everything (`sparse_simplex_topk`: threshold, projection, conjugate
value) costs O(k) per slice. The simplex threshold tau comes from the k sorted
values in O(k), or, for the dense large-k path, from Michelot's algorithm.

Every projection and threshold is differentiable, in forward and reverse
mode, along any axis: on the support S of the projection t (its nonzeros;
for the top-k ones within the k selected entries), dt = dx - (sum_S dx -
db) / |S| and zero off S, d tau = (sum_S dx - db) / |S|. The loops that find
tau (Michelot's `while_loop`, the radix selection, the loop over the binding
rows) cannot be transposed by JAX, so the thresholds carry this rule as a
custom JVP (`_threshold`, `_sparse_threshold`).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import selection

Array = jax.Array

def _expand(v, x: Array, axis: int) -> Array:
  """Broadcasts a per-slice quantity `v` (shape of x without `axis`) against x."""
  v = jnp.asarray(v, x.dtype)
  if v.ndim == x.ndim - 1:
    v = jnp.expand_dims(v, axis)
  return v


def _threshold_from_sorted(values: Array, b: Array, axis: int) -> Array:
  """tau with sum_i [v_i - tau]_+ = b for values sorted in decreasing order, keepdims.

  tau = max over r of (v_1 + ... + v_r - b) / r (Duchi et al. 2008: the terms
  increase up to the support size and decrease after). A running sum over the
  k slices, unrolled: this serves the passes kernel only (k below the radix
  crossover, `uses_radix`), where it is cheaper than a cumsum.
  """
  kk = values.shape[axis]
  if kk > 2 * max(selection._RADIX_MIN_K.values()):
    cs = jnp.cumsum(values, axis=axis)
    shape = [1] * values.ndim
    shape[axis] = kk
    r = jnp.arange(1, kk + 1, dtype=values.dtype).reshape(shape)
    return jnp.max((cs - b) / r, axis=axis, keepdims=True)
  total = jnp.zeros_like(lax.slice_in_dim(values, 0, 1, axis=axis))
  tau = jnp.full_like(total, -jnp.inf)
  for r in range(kk):
    total = total + lax.slice_in_dim(values, r, r + 1, axis=axis)
    tau = jnp.maximum(tau, (total - b) / (r + 1))
  return tau


def _sum_and_count(x: Array, active: Array, axis: int) -> Tuple[Array, Array]:
  """(sum of x over `active`, int32 count of `active`) along `axis`, keepdims.

  Along the minor axis one variadic reduction: XLA's CPU backend then makes
  one vectorised loop over x for both, where two reductions make two slower
  ones. Along another axis two reductions (there the variadic one is
  slower) (docs/OT.md, "Kernel timings").
  """
  values = jnp.where(active, x, 0)
  if not selection._minor_axis(x, axis):
    return (jnp.sum(values, axis=axis, keepdims=True),
            jnp.sum(active, axis=axis, keepdims=True, dtype=jnp.int32))
  return _variadic_sum_and_count(values, active, axis)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _variadic_sum_and_count(values: Array, active: Array, axis: int):
  s, cnt = lax.reduce((values, active.astype(jnp.int32)),
                      (jnp.zeros((), values.dtype), jnp.zeros((), jnp.int32)),
                      lambda p, q: (p[0] + q[0], p[1] + q[1]), (axis,))
  return jnp.expand_dims(s, axis), jnp.expand_dims(cnt, axis)


@_variadic_sum_and_count.defjvp
def _variadic_sum_and_count_jvp(axis, primals, tangents):
  # JAX's JVP rule for a variadic reduce fails on the count's symbolic-zero
  # tangent; the sum's tangent is a plain sum, the count has none.
  out = _variadic_sum_and_count(*primals, axis)
  d_values = tangents[0]
  d_sum = jnp.sum(d_values, axis=axis, keepdims=True)
  return out, (d_sum, np.zeros(out[1].shape, jax.dtypes.float0))


# Slices along the minor axis at least this long start Michelot from the
# threshold of their folded maxima (`_folded_lower_bound`).
_FOLD_MIN = 64


def _folded_lower_bound(x: Array, b: Array, axis: int) -> Array:
  """A lower bound of the simplex threshold of x along its minor axis: the
  threshold of the elementwise maxima of its four quarters (keepdims).

  Any subset of the entries has a threshold at most the whole slice's (fewer
  terms in sum [x_i - t]_+ - b, which decreases in t), and the maxima of the
  quarters usually hold most of the support when it is small against m. One
  pass folds x to a quarter of its length (four contiguous slices: vectorised),
  and Michelot runs on that, itself folded while long enough; from this bound
  Michelot on x needs 2 rounds instead of 7 (2000 x 64 near the semi-dual's
  optimum) (docs/OT.md, "Kernel timings").
  """
  m = x.shape[axis]
  q = -(-m // 4)
  if 4 * q != m:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, 4 * q - m)
    x = jnp.pad(x, pad, constant_values=-jnp.inf)
  quarters = [lax.slice_in_dim(x, i * q, (i + 1) * q, axis=axis) for i in range(4)]
  folded = jnp.maximum(jnp.maximum(quarters[0], quarters[1]), jnp.maximum(quarters[2], quarters[3]))
  return _michelot(folded, b, axis, None)[0]


def _michelot(x: Array, b: Array, axis: int, mask: Array | None):
  """(tau, count, rounds): tau (keepdims) with sum over `mask` of [x_i - tau]_+
  = b, how many entries of the mask lie above it (keepdims), and the number of
  rounds the loop ran (a scalar, for tests).

  Michelot's algorithm: from a lower bound of tau, repeatedly restrict to the
  entries above it; tau increases monotonically and stops after at most m rounds
  (a handful in practice). Each round is a Newton step on the convex, decreasing
  sum [x_i - tau]_+ - b, so it never overshoots. No sort. A round's sum and count
  are one variadic reduction (`_sum_and_count`).
  """
  folded = mask is None and selection._minor_axis(x, axis) and x.shape[axis] >= _FOLD_MIN
  if mask is None:
    mask = jnp.ones(x.shape, bool)
  xm = jnp.where(mask, x, 0)

  def tau_of(active):
    s, cnt = _sum_and_count(xm, active, axis)
    return (s - b) / jnp.maximum(cnt, 1).astype(x.dtype), cnt

  if folded:
    lower = _folded_lower_bound(x, b, axis)
  else:
    tau0, _ = tau_of(mask)
    # tau is the largest of (sum of the r largest - b) / r over r (Duchi et
    # al. 2008), so r = 1, max(x) - b, is a lower bound too; starting from the
    # larger bound saves most of the rounds when b is small against the spread
    # of x.
    lower = jnp.maximum(tau0, jnp.max(jnp.where(mask, x, -jnp.inf), axis=axis, keepdims=True) - b)
  tau0, cnt0 = tau_of(mask & (x > lower))
  # Nothing above the bound only happens for b == 0, where tau = max(x) is a root.
  tau0, cnt0 = jnp.where(cnt0 > 0, tau0, lower), jnp.maximum(cnt0, 1)
  max_rounds = x.shape[axis] + 2  # Michelot needs at most m rounds; guards NaNs

  def cond(carry):
    i, _, cnt, prev_cnt = carry
    return (i < max_rounds) & jnp.any(cnt != prev_cnt)

  def body(carry):
    i, tau, cnt, _ = carry
    new_tau, new_cnt = tau_of(mask & (x > tau))
    # In exact arithmetic the active set only shrinks. In float32 a rounded tau
    # can let an entry back in, and the count then cycles between two values
    # until max_rounds (seen at m = 50,000: seconds per evaluation): only a
    # shrinking set is taken, so every column stops within m rounds.
    keep = (new_cnt == 0) | (new_cnt >= cnt)
    return (i + 1, jnp.where(keep, tau, new_tau), jnp.where(keep, cnt, new_cnt), cnt)

  rounds, tau, cnt, _ = lax.while_loop(
      cond, body, (jnp.asarray(0), tau0, cnt0, jnp.full_like(cnt0, -1)))
  return tau, cnt, rounds


def _threshold_tangent(x: Array, tau: Array, support: Array | None, dx: Array, db: Array,
                       axis: int) -> Array:
  """d tau for tau = (sum over S of x_i - b) / |S|, S = support & (x > tau).

  The threshold is that average over its support S, which is locally
  constant away from ties (x_i = tau), so its derivative is the average of dx
  over S minus db / |S|. For b = 0 nothing lies above tau = max(x): S is then
  the maximisers (the derivative of a max, averaged over ties).
  """
  above = x > tau
  at_max = x >= tau
  if support is not None:
    above, at_max = above & support, at_max & support
  count = jnp.sum(above, axis=axis, keepdims=True)
  active = jnp.where(count > 0, above, at_max)
  count = jnp.sum(active, axis=axis, keepdims=True)
  d_sum = jnp.sum(jnp.where(active, dx, 0), axis=axis, keepdims=True)
  dtau = (d_sum - db) / jnp.maximum(count, 1).astype(x.dtype)
  return jnp.broadcast_to(dtau, tau.shape)


# The thresholds below run loops (Michelot's `while_loop`, the radix selection,
# a loop over the binding rows) that JAX cannot differentiate in reverse mode.
# Their derivative is known in closed form (`_threshold_tangent`), so they
# carry it as a custom JVP: reverse mode then transposes that linear rule,
# forward mode evaluates it, and the forward computation is unchanged (a
# custom JVP costs nothing when nothing is differentiated).
@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _threshold(x: Array, b: Array, mask: Array | None, axis: int) -> Array:
  return _michelot(x, b, axis, mask)[0]


@_threshold.defjvp
def _threshold_jvp(axis, primals, tangents):
  x, b, mask = primals
  dx, db, _ = tangents
  tau = _threshold(x, b, mask, axis)
  return tau, _threshold_tangent(x, tau, mask, dx, db, axis)


@precision.half_in_float32
def simplex_threshold(x: Array, b=1.0, axis: int = -1, mask: Array | None = None) -> Array:
  """tau such that sum_i [x_i - tau]_+ = b (over `mask` if given), keepdims.

  Michelot's algorithm (`_michelot`): no sort, a handful of passes over x.
  Differentiable in x and b (both modes): d tau = (sum over the support of
  dx - db) / |support|, the support being the entries of the mask above tau.
  """
  axis = axis % x.ndim
  return _threshold(x, _expand(b, x, axis), mask, axis)


@precision.half_in_float32
def sparse_simplex_threshold(x: Array, k: int, b=1.0, axis: int = -1):
  """(tau, mask) of the top-k sparsemax of the slices along `axis`, dense.

  mask: the k entries kept (None when k >= m); the projection is
  [x - tau]_+ on the mask. First the plain simplex threshold over the whole
  slice: when no slice has more than k entries above it, it is already the
  answer (the k largest entries include the support, so restricting to them
  changes nothing) and the selection is skipped. Otherwise the radix-selected
  mask (`threshold_top_k_mask`), and in closed form: a slice with more than k
  entries above its plain threshold keeps all of its k largest, so its tau is
  (sum of the k largest - b) / k (the terms (v_1 + ... + v_r - b) / r of
  `_threshold_from_sorted` increase up to the plain support's size); the
  other slices keep their plain threshold. For a 2-D x along its minor axis
  (the semi-dual's (n, m) layout) only the binding slices are selected, one
  at a time (near the optimum often one or two bind). Each then stops its
  radix passes as soon as its own k-th entry is told apart, where a batch of
  rows waited for its slowest one (docs/OT.md, "Kernel timings").
  """
  axis = axis % x.ndim
  return _sparse_threshold(x, _expand(b, x, axis), k, axis)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3))
def _sparse_threshold(x: Array, b: Array, k: int, axis: int):
  """`sparse_simplex_threshold` after its argument handling (b expanded)."""
  m = x.shape[axis]
  plain, count, _ = _michelot(x, b, axis, None)
  if k >= m:
    return plain, None

  binds = count > k

  def select(x, binds, b, plain):
    # The k-entry masks, and the closed-form tau where k binds.
    mask = selection.threshold_top_k_mask(x, k, axis)
    top_sum, _ = _sum_and_count(x, mask, axis)
    return jnp.where(binds, (top_sum - b) / k, plain), mask

  def binding(x, plain):
    return select(x, binds, b, plain)

  def not_binding(x, plain):
    return plain, jnp.ones(x.shape, bool)

  if x.ndim != 2 or axis != 1 or x.shape[0] == 1:
    return lax.cond(jnp.any(binds), binding, not_binding, x, plain)

  def by_rows(x, plain):
    # Only the binding rows of the (n, m) layout are selected, one at a time
    # (binding rows first: a stable argsort), each with its own early exit. One
    # selection in a loop, so the program is no larger than `binding`'s.
    order = jnp.argsort(~binds[:, 0], stable=True)
    b_all = jnp.broadcast_to(b, plain.shape)

    def body(i, carry):
      tau, mask = carry
      row = lax.dynamic_slice_in_dim(order, i, 1)
      row_tau, row_mask = select(x[row], jnp.ones((1, 1), bool), b_all[row], plain[row])
      return tau.at[row].set(row_tau), mask.at[row].set(row_mask)

    return lax.fori_loop(0, jnp.sum(binds), body, (plain, jnp.ones(x.shape, bool)))

  return by_rows(x, plain)


@_sparse_threshold.defjvp
def _sparse_threshold_jvp(k, axis, primals, tangents):
  # The support is the selected k (or all) entries above tau: see `_threshold`.
  x, b = primals
  dx, db = tangents
  tau, mask = _sparse_threshold(x, b, k, axis)
  d_mask = None if mask is None else np.zeros(mask.shape, jax.dtypes.float0)
  return (tau, mask), (_threshold_tangent(x, tau, mask, dx, db, axis), d_mask)


@precision.half_in_float32
def projection_simplex(x: Array, b=1.0, axis: int = -1) -> Array:
  """Projection onto the b-scaled simplex {t >= 0, sum t = b} along `axis`."""
  tau = simplex_threshold(x, b, axis)
  return jnp.maximum(x - tau, 0)


@precision.half_in_float32
def projection_sparse_simplex(x: Array, k: int, b=1.0, axis: int = -1) -> Array:
  """Projection onto {t in b * simplex, ||t||_0 <= k} (top-k sparsemax).

  Equals [topk(x) - tau]_+ (paper eq. k-sparse-simplex). k >= m is the plain
  simplex projection.
  """
  return sparse_simplex_parts(x, k, b, axis)[0]


class SparseSimplex(NamedTuple):
  """Top-k sparsemax of the slices along `axis`, in compact form (k along `axis`).

  values: the projection's entries at `indices` (zero where not active).
  indices: int32 positions along the projected axis (distinct per slice).
  tau: the threshold (keepdims): values = [x[indices] - tau]_+ on the active set.
  count: number of active entries (values > 0 up to rounding; keepdims, float).
  sum_sq: sum of x^2 over the active entries (keepdims).
  """
  values: Array
  indices: Array
  tau: Array
  count: Array
  sum_sq: Array


@precision.half_in_float32
def sparse_simplex_topk(x: Array, k: int, b=1.0, axis: int = -1) -> SparseSimplex:
  """Top-k sparsemax in compact form: only the k selected entries are touched
  after the selection passes, so the projection, the threshold and the
  conjugate's value cost O(k) per slice instead of extra passes over x.

  Requires 1 <= k <= m.
  """
  axis = axis % x.ndim
  b = _expand(b, x, axis)
  values, indices = selection.top_k(x, k, axis)
  tau = _threshold_from_sorted(values, b, axis)
  # Under the packed float64 keys near-ties (2^-(52 - ceil(log2 m)) relative)
  # may be out of order, which can put tau off by that much: recompute it from
  # the active set so that sum_active (x - tau) = b holds to rounding. Entries
  # within rounding of tau stay in the set with t clipped at 0.
  active = values > tau
  n_act = jnp.sum(active, axis=axis, keepdims=True)
  count = n_act.astype(x.dtype)
  va = jnp.where(active, values, 0)
  s1 = jnp.sum(va, axis=axis, keepdims=True)
  tau = jnp.where(n_act > 0, (s1 - b) / jnp.maximum(count, 1), tau)  # n_act = 0 iff b = 0
  t = jnp.where(active, jnp.maximum(values - tau, 0), 0)
  return SparseSimplex(t, indices, tau, count, jnp.sum(va * va, axis=axis, keepdims=True))


@precision.half_in_float32
def sparse_simplex_parts(x: Array, k: int, b=1.0, axis: int = -1):
  """Top-k sparsemax and its threshold, dense: (t, tau (keepdims)).

  For k >= m the plain simplex projection; for large k (`uses_radix`)
  `sparse_simplex_threshold`; otherwise the compact form, densified.
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  if k >= m or selection.uses_radix(k, m, x.dtype, selection._minor_axis(x, axis)):
    tau, mask = sparse_simplex_threshold(x, k, b, axis)
    active = x > tau
    if mask is not None:
      active = active & mask
    return jnp.where(active, x - tau, 0), tau
  sp = sparse_simplex_topk(x, k, b, axis)
  return selection.densify(sp.values, sp.indices, m, axis), sp.tau


@precision.half_in_float32
def projection_sparse_nonneg(x: Array, k: int, axis: int = -1) -> Array:
  """Projection onto {t >= 0, ||t||_0 <= k}: [topk(x)]_+ along `axis`."""
  axis = axis % x.ndim
  if k >= x.shape[axis]:
    return jnp.maximum(x, 0)
  mask, _ = selection.top_k_mask(x, k, axis)
  return jnp.where(mask, jnp.maximum(x, 0), 0)


@precision.half_in_float32
def projection_nonneg(x: Array) -> Array:
  """Projection onto the non-negative orthant."""
  return jnp.maximum(x, 0)
