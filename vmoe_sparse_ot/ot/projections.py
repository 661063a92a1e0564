"""Euclidean projections used by the OT conjugates, batched over leading axes.

All functions act along one `axis` of `x` (default: the last) and broadcast over
the others, so an (m, n) matrix of columns is projected with `axis=0`.

Top-k selection avoids sorting (slow on CPU, see DESIGN.md "timing facts"): k
reduction passes find the k largest values in decreasing order, ties broken by
the lower index (the same set `lax.top_k` picks), and the selection mask is then
formed densely by comparison -- no scatter, no gather, cheap under `vmap`.
The simplex threshold tau comes from the k sorted values in O(k).
"""
from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


def _expand(v, x: Array, axis: int) -> Array:
  """Broadcasts a per-slice quantity `v` (shape of x without `axis`) against x."""
  v = jnp.asarray(v, x.dtype)
  if v.ndim == x.ndim - 1:
    v = jnp.expand_dims(v, axis)
  return v


def _use_keys(x: Array) -> bool:
  return bool(jax.config.jax_enable_x64) and x.dtype in (jnp.float32, jnp.float64)


def _sort_keys(x: Array, axis: int):
  """int64 keys ordered like (value decreasing, index increasing), all distinct.

  The float's bits are mapped to an order-preserving integer; its lowest
  ceil(log2 m) bits are replaced by (m - 1 - index). float32 keeps every bit;
  float64 keeps 52 - ceil(log2 m) mantissa bits (2e-13 relative for m = 1000), so
  only entries closer than that are ranked by index instead of value.
  """
  m = x.shape[axis]
  nb = max(1, (m - 1).bit_length())
  if x.dtype == jnp.float32:
    bits = lax.bitcast_convert_type(x, jnp.int32)
    ordered = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits).astype(jnp.int64) << 32
    shift = 0
  else:
    bits = lax.bitcast_convert_type(x, jnp.int64)
    ordered = jnp.where(bits < 0, bits ^ jnp.int64(0x7FFFFFFFFFFFFFFF), bits)
    shift = nb
  idx = lax.broadcasted_iota(jnp.int64, x.shape, axis)
  high = (ordered >> shift) << shift if shift else ordered
  return high | (m - 1 - idx), shift, nb


def _decode_keys(keys: Array, dtype, shift: int, nb: int) -> Array:
  if dtype == jnp.float32:
    ordered = (keys >> 32).astype(jnp.int32)
    bits = jnp.where(ordered < 0, ordered ^ jnp.int32(0x7FFFFFFF), ordered)
    return lax.bitcast_convert_type(bits, jnp.float32)
  ordered = (keys >> nb) << nb
  bits = jnp.where(ordered < 0, ordered ^ jnp.int64(0x7FFFFFFFFFFFFFFF), ordered)
  return lax.bitcast_convert_type(bits, jnp.float64)


def top_k_mask(x: Array, k: int, axis: int = -1) -> Tuple[Array, Array]:
  """The k largest entries of `x` along `axis`, without sorting.

  Ties are broken by the lower index (the set `lax.top_k` picks). With 64-bit
  enabled, one max-reduction per selected entry over packed (value, index) keys;
  otherwise two reductions per entry (value, then index).

  Args:
    x: array (..., m, ...).
    k: static int, 1 <= k <= m.
    axis: the axis of length m.

  Returns:
    mask: bool array of x's shape, exactly k True per slice.
    values: array with `axis` of length k, the selected values in decreasing
      order (float64 under the packed keys: rounded down to 52 - ceil(log2 m)
      mantissa bits; exact otherwise).
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  if not 1 <= k <= m:
    raise ValueError(f"k must be in [1, {m}], got {k}")
  red_shape = list(x.shape)
  red_shape[axis] = 1
  if _use_keys(x):
    keys, shift, nb = _sort_keys(x, axis)
    lo = jnp.iinfo(jnp.int64).min
    prev = jnp.full(red_shape, jnp.iinfo(jnp.int64).max, jnp.int64)
    picked = []
    for _ in range(k):
      prev = jnp.max(jnp.where(keys < prev, keys, lo), axis=axis, keepdims=True)
      picked.append(prev)
    return keys >= prev, _decode_keys(jnp.concatenate(picked, axis), x.dtype, shift, nb)
  idx = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  prev_v = jnp.full(red_shape, jnp.inf, x.dtype)
  prev_i = jnp.full(red_shape, -1, jnp.int32)
  neg_inf = jnp.array(-jnp.inf, x.dtype)
  values = []
  for _ in range(k):
    # Candidates come strictly after (prev_v, prev_i) in the order
    # "value decreasing, then index increasing".
    cand = (x < prev_v) | ((x == prev_v) & (idx > prev_i))
    v = jnp.max(jnp.where(cand, x, neg_inf), axis=axis, keepdims=True)
    i = jnp.min(jnp.where(cand & (x == v), idx, m), axis=axis, keepdims=True)
    values.append(v)
    prev_v, prev_i = v, i
  mask = (x > prev_v) | ((x == prev_v) & (idx <= prev_i))
  return mask, jnp.concatenate(values, axis=axis)


def _threshold_from_sorted(values: Array, b: Array, axis: int) -> Tuple[Array, Array]:
  """tau with sum_i [v_i - tau]_+ = b for values sorted in decreasing order.

  Returns tau (keepdims along `axis`) and the number rho of active values.
  """
  kk = values.shape[axis]
  cs = jnp.cumsum(values, axis=axis)
  shape = [1] * values.ndim
  shape[axis] = kk
  r = jnp.arange(1, kk + 1, dtype=values.dtype).reshape(shape)
  taus = (cs - b) / r
  # The condition holds on a prefix (Duchi et al. 2008); rho is its length.
  cond = values > taus
  rho = jnp.maximum(jnp.sum(cond, axis=axis, keepdims=True), 1).astype(values.dtype)
  tau = jnp.sum(jnp.where(r == rho, taus, 0), axis=axis, keepdims=True)
  return tau, rho


def simplex_threshold(x: Array, b=1.0, axis: int = -1, mask: Array | None = None) -> Array:
  """tau such that sum_i [x_i - tau]_+ = b (over `mask` if given), keepdims.

  Michelot's algorithm: start from the mean-based lower bound and repeatedly
  restrict to the entries above tau; tau increases monotonically and stops after
  at most m rounds (a handful in practice). No sort.
  """
  axis = axis % x.ndim
  b = _expand(b, x, axis)
  if mask is None:
    mask = jnp.ones(x.shape, bool)
  xm = jnp.where(mask, x, 0)

  def tau_of(active):
    cnt = jnp.sum(active, axis=axis, keepdims=True)
    s = jnp.sum(jnp.where(active, xm, 0), axis=axis, keepdims=True)
    return (s - b) / jnp.maximum(cnt, 1).astype(x.dtype), cnt

  tau0, cnt0 = tau_of(mask)
  max_rounds = x.shape[axis] + 2  # Michelot needs at most m rounds; guards NaNs

  def cond(carry):
    i, _, cnt, prev_cnt = carry
    return (i < max_rounds) & jnp.any(cnt != prev_cnt)

  def body(carry):
    i, tau, cnt, _ = carry
    new_tau, new_cnt = tau_of(mask & (x > tau))
    # Nothing above tau only happens for b == 0, where tau = max(x) is a root.
    keep = new_cnt == 0
    return (i + 1, jnp.where(keep, tau, new_tau), jnp.where(keep, cnt, new_cnt), cnt)

  _, tau, _, _ = lax.while_loop(
      cond, body, (jnp.asarray(0), tau0, cnt0, jnp.full_like(cnt0, -1)))
  return tau


def projection_simplex(x: Array, b=1.0, axis: int = -1) -> Array:
  """Projection onto the b-scaled simplex {t >= 0, sum t = b} along `axis`."""
  tau = simplex_threshold(x, b, axis)
  return jnp.maximum(x - tau, 0)


def projection_sparse_simplex(x: Array, k: int, b=1.0, axis: int = -1) -> Array:
  """Projection onto {t in b * simplex, ||t||_0 <= k} (top-k sparsemax).

  Equals [topk(x) - tau]_+ (paper eq. k-sparse-simplex). k >= m is the plain
  simplex projection.
  """
  t, _, _ = sparse_simplex_parts(x, k, b, axis)
  return t


def sparse_simplex_parts(x: Array, k: int, b=1.0, axis: int = -1):
  """Top-k sparsemax with its internals.

  Returns (t, tau, (count, sum_sq)): the projection, the threshold (keepdims),
  and over the active entries (t > 0) their number and the sum of their squared
  values (both keepdims; used for the conjugate's value). For k >= m the plain
  simplex projection is used.
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  b = _expand(b, x, axis)
  if k >= m:
    tau = simplex_threshold(x, b, axis)
    active = x > tau
    xa = jnp.where(active, x, 0)
    count = jnp.sum(active, axis=axis, keepdims=True).astype(x.dtype)
    return jnp.maximum(x - tau, 0), tau, (count, jnp.sum(xa * xa, axis=axis, keepdims=True))
  mask, values = top_k_mask(x, k, axis)
  tau, _ = _threshold_from_sorted(values, b, axis)
  # One pass for the active set's statistics. Under packed float64 keys the
  # sorted values are rounded, so tau is recomputed exactly from them
  # (sum_active (x - tau) = b); entries within rounding of tau stay in the set
  # with t clipped at 0.
  active = mask & (x > tau)
  xa = jnp.where(active, x, 0)
  n_act = jnp.sum(active, axis=axis, keepdims=True)
  s1 = jnp.sum(xa, axis=axis, keepdims=True)
  sum_sq = jnp.sum(xa * xa, axis=axis, keepdims=True)
  count = n_act.astype(x.dtype)
  if _use_keys(x) and x.dtype == jnp.float64:
    tau = jnp.where(n_act > 0, (s1 - b) / jnp.maximum(count, 1), tau)  # n_act = 0 iff b = 0
  t = jnp.where(active, jnp.maximum(x - tau, 0), 0)
  return t, tau, (count, sum_sq)


def projection_sparse_nonneg(x: Array, k: int, axis: int = -1) -> Array:
  """Projection onto {t >= 0, ||t||_0 <= k}: [topk(x)]_+ along `axis`."""
  axis = axis % x.ndim
  if k >= x.shape[axis]:
    return jnp.maximum(x, 0)
  mask, _ = top_k_mask(x, k, axis)
  return jnp.where(mask, jnp.maximum(x, 0), 0)


def projection_nonneg(x: Array) -> Array:
  """Projection onto the non-negative orthant."""
  return jnp.maximum(x, 0)
