"""The squared k-support norm Psi (paper eq. sq_k_support_norm).

Psi(t) = 1/2 min_lambda sum_i t_i^2 / lambda_i  s.t.  sum lambda = k, 0 < lambda <= 1,
the biconjugate of 1/2 ||t||^2 + indicator(||t||_0 <= k) (Proposition 3, biconjugates),
so P_Psi(T) - D is a computable duality gap for sparsity-constrained OT.

Computed exactly in O(m log m) by Argyriou et al. (2012, Prop. 2.1) /
McDonald et al. (2016): with z = |t| sorted decreasingly and z_0 = +inf, the
unique r in {0, ..., k-1} with
    z_{k-r-1} > (1 / (r+1)) sum_{i >= k-r} z_i >= z_{k-r}
gives ||t||_(k)^2 = sum_{i < k-r} z_i^2 + (sum_{i >= k-r} z_i)^2 / (r + 1).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.ot import precision

Array = jax.Array


@precision.half_in_float32
def squared_k_support_norm(t: Array, k: int, axis: int = -1) -> Array:
  """Psi(t) = 1/2 ||t||_(k)^2 along `axis` (reduced). k >= m gives 1/2 ||t||^2."""
  t = jnp.moveaxis(jnp.asarray(t), axis, -1)
  m = t.shape[-1]
  if k >= m:
    return 0.5 * jnp.sum(t * t, axis=-1)
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  z = -jnp.sort(-jnp.abs(t), axis=-1)  # decreasing
  # tail[j] = sum_{i >= j} z_i (0-based), head_sq[j] = sum_{i < j} z_i^2.
  tail = jnp.flip(jnp.cumsum(jnp.flip(z, -1), axis=-1), -1)
  head_sq = jnp.cumsum(z * z, axis=-1) - z * z
  r = jnp.arange(k)  # candidate r = 0..k-1
  start = k - 1 - r  # 0-based index of z_{k-r} (1-based)
  tail_r = jnp.take(tail, start, axis=-1)
  mean_r = tail_r / (r + 1).astype(t.dtype)
  z_before = jnp.where(start >= 1, jnp.take(z, jnp.maximum(start - 1, 0), axis=-1), jnp.inf)
  # The valid r is the first one whose left inequality z_{k-r-1} > mean_r holds:
  # if it fails at r, the right one holds at r + 1, and the right one holds at r
  # whenever the left one fails at r - 1 (r = k-1 always qualifies, z_0 = inf).
  # At ties both branches give the same value, so rounding cannot hurt.
  ok = z_before > mean_r
  first = jnp.argmax(ok, axis=-1)
  values = jnp.take(head_sq, start, axis=-1) + tail_r * tail_r / (r + 1).astype(t.dtype)
  val = jnp.take_along_axis(values, first[..., None], axis=-1)[..., 0]
  return 0.5 * val
