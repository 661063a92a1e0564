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


def top_k_mask(x: Array, k: int, axis: int = -1) -> Tuple[Array, Array]:
  """The k largest entries of `x` along `axis`, without sorting.

  Args:
    x: array (..., m, ...).
    k: static int, 1 <= k <= m.
    axis: the axis of length m.

  Returns:
    mask: bool array of x's shape, exactly k True per slice (ties broken by the
      lower index).
    values: array with `axis` of length k, the selected values in decreasing order.
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  if not 1 <= k <= m:
    raise ValueError(f"k must be in [1, {m}], got {k}")
  idx = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  red_shape = list(x.shape)
  red_shape[axis] = 1
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

  Returns (t, tau, (values, rho)): the projection, the threshold (keepdims) and
  the sorted top-k values with the number of active ones (None for k >= m, when
  the plain simplex projection is used).
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  b = _expand(b, x, axis)
  if k >= m:
    tau = simplex_threshold(x, b, axis)
    return jnp.maximum(x - tau, 0), tau, None
  mask, values = top_k_mask(x, k, axis)
  tau, rho = _threshold_from_sorted(values, b, axis)
  t = jnp.where(mask, jnp.maximum(x - tau, 0), 0)
  return t, tau, (values, rho)


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
