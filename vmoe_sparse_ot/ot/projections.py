"""Euclidean projections used by the OT conjugates, batched over leading axes.

All functions act along one `axis` of `x` (default: the last) and broadcast over
the others, so an (m, n) matrix of columns is projected with `axis=0`.

Top-k selection avoids sorting (slow on CPU: see benchmarks/RESULTS.md). For
small k, k reduction passes find the k largest values in decreasing order; for
large k (`uses_radix`), a radix selection on order-preserving integer keys finds
the k-th value in at most 32 (float32) or 64 (float64) bits whatever k is (fewer
when the k-th and (k+1)-th values differ early in their bits), one bit per
counting pass, or two along the contiguous axis (variadic reductions).
Either way ties go to the lower index (the same set `lax.top_k` picks).
`top_k_mask` then forms the selection mask densely by comparison; `top_k` reads
the positions off the packed keys and gathers the k exact values, so that
everything after the selection (`sparse_simplex_topk`: threshold, projection,
conjugate value) costs O(k) per slice instead of further passes over x. The
simplex threshold tau comes from the k sorted values in O(k).
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np
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


def _top_keys(x: Array, k: int, axis: int):
  """The k largest packed keys along `axis` (decreasing, k along axis), by
  max-reduction passes; returns (keys, top keys, shift, nb)."""
  keys, shift, nb = _sort_keys(x, axis)
  return keys, _largest_keys(keys, k, axis, x.shape[axis], nb, 1), shift, nb


# Blocks of _BLOCK entries (`_largest_keys`): a slice is cut into blocks only
# when it has at least _BLOCK_MIN_ROWS_PER_K * k * _BLOCK entries. Blocks of 4
# beat 2 and 8 at 500 x 500 and 1000 x 1000 (k = 5); shorter slices (256
# entries at k = 16, the router batch) were no faster cut.
_BLOCK = 4
_BLOCK_MIN_ROWS_PER_K = 8


def _max_passes(keys: Array, k: int, axis: int) -> Array:
  """k "next smaller maximum" passes over distinct keys: the k largest, decreasing."""
  red_shape = list(keys.shape)
  red_shape[axis] = 1
  lo = jnp.iinfo(jnp.int64).min
  prev = jnp.full(red_shape, jnp.iinfo(jnp.int64).max, jnp.int64)
  picked = []
  for _ in range(k):
    prev = jnp.max(jnp.where(keys < prev, keys, lo), axis=axis, keepdims=True)
    picked.append(prev)
  return jnp.concatenate(picked, axis)


def _largest_keys(keys: Array, k: int, axis: int, m: int, nb: int, scale: int) -> Array:
  """The k largest of distinct packed keys along `axis`, decreasing.

  Long slices are cut into blocks of _BLOCK entries: the k largest keys lie in
  the k blocks with the largest maxima (a key in any other block is below k
  block maxima, hence below k keys), so one pass takes the block maxima, their
  k largest are found the same way (recursively), and the k passes run over
  the k gathered blocks only. Position r of `keys` along `axis` covers the
  original entries [r * scale, (r + 1) * scale); a key's original position is
  in its low nb bits (`_sort_keys`). The selection at 500 x 500, k = 5:
  0.11 ms against 0.34 ms for k passes over the whole slice; 1000 x 1000:
  0.34 against 1.2 ms.
  """
  rows = keys.shape[axis]
  if rows < _BLOCK_MIN_ROWS_PER_K * k * _BLOCK:
    return _max_passes(keys, k, axis)
  n_blocks = -(-rows // _BLOCK)
  pad = n_blocks * _BLOCK - rows
  if pad:
    # The padding shares the last block with real keys, so never is a block max.
    pad_shape = list(keys.shape)
    pad_shape[axis] = pad
    keys = jnp.concatenate([keys, jnp.full(pad_shape, jnp.iinfo(jnp.int64).min, keys.dtype)],
                           axis)
  blocks = keys.reshape(keys.shape[:axis] + (n_blocks, _BLOCK) + keys.shape[axis + 1:])
  block_max = jnp.max(blocks, axis=axis + 1)
  top_blocks = _largest_keys(block_max, k, axis, m, nb, scale * _BLOCK)
  position = (m - 1) - (top_blocks & ((1 << nb) - 1))
  block = (position // (scale * _BLOCK)).astype(jnp.int32)
  picked = jnp.take_along_axis(blocks, jnp.expand_dims(block, axis + 1), axis=axis)
  return _max_passes(picked.reshape(keys.shape[:axis] + (k * _BLOCK,) + keys.shape[axis + 1:]),
                     k, axis)


def _top_pairs(x: Array, k: int, axis: int):
  """Two reductions per entry (value, then index; no 64-bit keys needed).

  Returns (values, indices) with `axis` of length k, in selection order.
  """
  m = x.shape[axis]
  red_shape = list(x.shape)
  red_shape[axis] = 1
  idx = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  prev_v = jnp.full(red_shape, jnp.inf, x.dtype)
  prev_i = jnp.full(red_shape, -1, jnp.int32)
  neg_inf = jnp.array(-jnp.inf, x.dtype)
  values, indices = [], []
  for _ in range(k):
    # Candidates come strictly after (prev_v, prev_i) in the order
    # "value decreasing, then index increasing".
    cand = (x < prev_v) | ((x == prev_v) & (idx > prev_i))
    v = jnp.max(jnp.where(cand, x, neg_inf), axis=axis, keepdims=True)
    i = jnp.min(jnp.where(cand & (x == v), idx, m), axis=axis, keepdims=True)
    values.append(v)
    indices.append(i)
    prev_v, prev_i = v, i
  return jnp.concatenate(values, axis), jnp.concatenate(indices, axis)


def _order_keys(x: Array) -> Array:
  """Unsigned integer keys of x's width, ordered like the values (float32 or float64).

  Negative floats have all their bits flipped, non-negative ones only the sign
  bit; -0.0 is first mapped to +0.0 so that equal values have equal keys.
  """
  x = jnp.where(x == 0, jnp.zeros((), x.dtype), x)
  if x.dtype == jnp.float64:
    bits = lax.bitcast_convert_type(x, jnp.uint64)
    sign = jnp.uint64(1 << 63)
  else:
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    sign = jnp.uint32(1 << 31)
  return jnp.where(bits >= sign, ~bits, bits | sign)


def _counts(hits, axis: int):
  """int32 counts of several bool arrays along `axis` (keepdims), in one
  variadic reduction (one loop over the data on XLA's CPU backend)."""
  out = lax.reduce(tuple(h.astype(jnp.int32) for h in hits),
                   tuple(jnp.zeros((), jnp.int32) for _ in hits),
                   lambda p, q: tuple(u + v for u, v in zip(p, q)), (axis,))
  return tuple(jnp.expand_dims(c, axis) for c in out)


def _minor_axis(x: Array, axis: int) -> bool:
  """Whether `axis` is x's contiguous (last) axis: the layout where XLA's CPU
  reductions vectorise along the reduced entries, and a variadic reduction of
  several outputs is no slower than one of them."""
  return axis % x.ndim == x.ndim - 1


def _radix_select(keys: Array, k, axis: int, valid=None, early_exit: bool = False,
                  nbits: int | None = None):
  """A radix selection of the k-th largest of each slice of unsigned `keys`,
  counting only `valid` entries; k may be an array (keepdims). `nbits`: how
  many low bits the keys use (all of their width by default).

  The answer's digits are fixed from the highest down; a digit is the largest
  d such that at least k entries are >= the answer with that digit. One counting
  pass per digit, in a loop that is not unrolled: binary digits (one count per
  pass), or, where `axis` is the minor axis, base-4 digits (three counts per
  pass in one variadic reduction, which costs about what one count does there:
  at 10,000 x 100 in the (n, m) layout, 0.094 ms against 0.17 ms for a single
  count; half the passes).

  Returns (t, count), keepdims: count = number of valid entries >= t. Without
  `early_exit` t is the k-th largest key. With it, the loop also stops once
  every slice has count == k: then t is a lower bound of the k-th largest with
  exactly k entries at or above it, all that a selection mask needs (the digits
  below the first one that separates the k-th from the (k+1)-th key are never
  counted; an exact tie at the k-th key still runs every digit).
  """
  digit_bits = 2 if _minor_axis(keys, axis) else 1
  nbits = keys.dtype.itemsize * 8 if nbits is None else -(-nbits // digit_bits) * digit_bits
  red_shape = list(keys.shape)
  red_shape[axis] = 1

  def hits_at_least(t):
    hit = keys >= t
    return hit if valid is None else hit & valid

  def cond(carry):
    i, _, count = carry
    running = i < nbits // digit_bits
    return running & jnp.any(count != k) if early_exit else running

  def body(carry):
    i, t, count = carry
    shift = (nbits - digit_bits * (i + 1)).astype(keys.dtype)
    cands = [t | (jnp.asarray(d, keys.dtype) << shift) for d in range(1, 2 ** digit_bits)]
    if digit_bits == 1:
      cand_counts = [jnp.sum(hits_at_least(cands[0]), axis=axis, keepdims=True,
                             dtype=jnp.int32)]
    else:
      cand_counts = _counts([hits_at_least(c) for c in cands], axis)
    # Digits in increasing order: the last one with enough entries wins.
    for cand, cand_count in zip(cands, cand_counts):
      take = cand_count >= k
      t, count = jnp.where(take, cand, t), jnp.where(take, cand_count, count)
    return i + 1, t, count

  t0 = jnp.zeros(red_shape, keys.dtype)
  if valid is None:
    count0 = jnp.full(red_shape, keys.shape[axis], jnp.int32)
  else:
    count0 = jnp.sum(valid, axis=axis, keepdims=True, dtype=jnp.int32)
  _, t, count = lax.while_loop(cond, body, (jnp.asarray(0), t0, count0))
  return t, count


def _select_key(keys: Array, k: int, axis: int, early_exit: bool):
  """(t, count) of `_radix_select` for any unsigned keys.

  64-bit keys are split in two 32-bit words (the high word's selection, then the
  low word's among the entries sharing it): at most the same 64 bits, over
  half-width data. With `early_exit` the low word is skipped altogether when
  the high word already separates every slice's k-th entry from its (k+1)-th.
  """
  if keys.dtype != jnp.uint64:
    return _radix_select(keys, k, axis, early_exit=early_exit)
  high = (keys >> 32).astype(jnp.uint32)
  low = keys.astype(jnp.uint32)
  h, count = _radix_select(high, k, axis, early_exit=early_exit)

  def low_word(h, count):
    same = high == h
    n_above = jnp.sum(high > h, axis=axis, keepdims=True, dtype=jnp.int32)
    k_low = k - n_above
    if early_exit:
      # Slices already separated keep t = (h, 0): their count stays k.
      k_low = jnp.where(count == k, jnp.sum(same, axis=axis, keepdims=True, dtype=jnp.int32),
                        k_low)
    lo, count = _radix_select(low, k_low, axis, valid=same, early_exit=early_exit)
    return (h.astype(jnp.uint64) << 32) | lo.astype(jnp.uint64), count + n_above

  def high_only(h, count):
    return h.astype(jnp.uint64) << 32, count

  if not early_exit:
    return low_word(h, count)
  return lax.cond(jnp.all(count == k), high_only, low_word, h, count)


def kth_largest_key(keys: Array, k: int, axis: int) -> Array:
  """The k-th largest of each slice of unsigned `keys`, keepdims along `axis`.

  32 bits for 32-bit keys, 64 for 64-bit ones (one counting pass per bit, or
  per two along the contiguous axis), whatever k is.
  """
  return _select_key(keys, k, axis, early_exit=False)[0]


def threshold_top_k_mask(x: Array, k: int, axis: int = -1) -> Array:
  """bool mask of the k largest entries along `axis` by radix selection.

  Same set as `top_k_mask` (ties at the k-th value go to the lower indices) at
  a cost that does not depend on k: the counting passes of at most 32
  (float32) or 64 (float64) bits (`_radix_select`), fewer when every slice's
  k-th and (k+1)-th values differ in their leading bits (its early exit), and,
  only when some slice has more ties at its k-th value than it can take, a
  second radix selection on the tied entries' indices (ceil(log2 m) bits).
  Needs 64-bit types (x64) for float64 input; float16/bfloat16 are selected
  as float32.
  """
  axis = axis % x.ndim
  _check_k(k, x.shape[axis])
  if x.dtype not in (jnp.float32, jnp.float64):
    x = x.astype(jnp.float32)
  keys = _order_keys(x)
  t, count = _select_key(keys, k, axis, early_exit=True)

  def exact_count(keys, t):
    return keys >= t

  def with_ties(keys, t):
    # Some slice ran every bit: its t is the k-th key and more than k entries
    # equal it or lie above. (Slices that stopped early have exactly k keys at
    # or above their t and take every entry equal to it.) Ties at t go to the
    # lower indices: the k - n_above largest reversed indices m - 1 - i among
    # them, selected like the values (indices are distinct, so the early exit
    # always applies; a cumulative sum over the slice cost ~20 counting passes
    # at 10,000 x 100).
    above = keys > t
    n_above = jnp.sum(above, axis=axis, keepdims=True, dtype=jnp.int32)
    at = keys == t
    m = keys.shape[axis]
    shape = [1] * keys.ndim
    shape[axis] = m
    reversed_index = (m - 1 - jnp.arange(m, dtype=jnp.uint32)).reshape(shape)
    reversed_index = jnp.broadcast_to(reversed_index, keys.shape)
    lowest, _ = _radix_select(reversed_index, k - n_above, axis, valid=at, early_exit=True,
                              nbits=max(1, (m - 1).bit_length()))
    return above | (at & (reversed_index >= lowest))

  # A tie that straddles the k-th place is rare for real data: pay for the
  # second selection only when one occurs.
  return lax.cond(jnp.all(count == k), exact_count, with_ties, keys, t)


# Kernel choice: the passes kernel costs about k reductions per slice, the radix
# kernel a bounded number of counting passes (more for float64). Measured with
# benchmarks/ot_solvers.py --kernels --threads 1 (2-core CPU), one semi-dual
# evaluation near the optimum at (5000, 10), (2000, 64), (1000, 1000),
# (500, 500) and (100, 100): the radix kernel wins from about these k on (see
# RESULTS.md). Along the minor axis (the dense semi-dual's (n, m) layout) its
# passes are base-4 variadic reductions and it wins earlier: float64 k = 32,
# 2.0-4.6x on all five shapes (at k = 16 it won on four, 1.9-2.3x, but lost on
# 2000 x 64, 0.96x, and on the router batch of 64 x 256 x 32, 1.5x); along
# another axis it counts one bit per pass and the old crossover holds.
_RADIX_MIN_K = {4: 32, 8: 48}
_RADIX_MIN_K_MINOR = {4: 16, 8: 32}


def uses_radix(k: int, m: int, dtype, minor_axis: bool = False) -> bool:
  """Whether top-k selection of k of m entries of `dtype` uses radix selection
  (`minor_axis`: along the array's contiguous axis)."""
  if k >= m:
    return False
  table = _RADIX_MIN_K_MINOR if minor_axis else _RADIX_MIN_K
  return k >= table[8 if jnp.dtype(dtype) == jnp.float64 else 4]


def _tree(x: Array, op) -> Array:
  """(1, ...): x (m, ...) reduced along axis 0 by a halving tree of elementwise `op`.

  XLA's CPU backend fuses such a tree with the where() producing x, whereas a
  reduce op first writes the full where() array.
  """
  while x.shape[0] > 1:
    h = x.shape[0] // 2
    y = op(x[:h], x[h:2 * h])
    x = jnp.concatenate([y, x[2 * h:]]) if x.shape[0] % 2 else y
  return x


def distinct_top_values(x: Array, k: int) -> Array:
  """(k, ...): the k largest distinct values along axis 0 of x (m, ...), decreasing.

  -inf once a slice has fewer than k distinct values. One "next smaller maximum"
  pass over x per value, in a loop (compile time does not grow with k; the loop
  keeps each pass a separate fusion reading x from memory). The values-only
  passes kernel, for callers that handle ties themselves (`ot.batched`).
  """
  def body(r, carry):
    v, values = carry
    v = _tree(jnp.where(x < v, x, -jnp.inf), jnp.maximum)
    return v, lax.dynamic_update_slice_in_dim(values, v, r, 0)

  init = (jnp.full((1,) + x.shape[1:], jnp.inf, x.dtype), jnp.zeros((k,) + x.shape[1:], x.dtype))
  return lax.fori_loop(0, k, body, init)[1]


def count_at_least(x: Array, thresholds: Array) -> Array:
  """(r, ...): entries of each slice of x (m, ...) >= each of `thresholds` (r, ...)."""
  return _tree((x[:, None] >= thresholds[None]).astype(x.dtype), jnp.add)[0]


def _check_k(k: int, m: int):
  if not 1 <= k <= m:
    raise ValueError(f"k must be in [1, {m}], got {k}")


def top_k_mask(x: Array, k: int, axis: int = -1) -> Tuple[Array, Array]:
  """The k largest entries of `x` along `axis`, without sorting.

  Ties are broken by the lower index (the set `lax.top_k` picks). For small k,
  with 64-bit enabled, one max-reduction per selected entry over packed (value,
  index) keys; otherwise two reductions per entry (value, then index). For large
  k (`uses_radix`), `threshold_top_k_mask`, whose cost does not grow with k.

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
  _check_k(k, m)
  if uses_radix(k, m, x.dtype):
    # Values (sorted) only if the caller uses them; XLA drops them otherwise.
    values = jnp.moveaxis(lax.top_k(jnp.moveaxis(x, axis, -1), k)[0], -1, axis)
    return threshold_top_k_mask(x, k, axis), values
  if _use_keys(x):
    keys, top, shift, nb = _top_keys(x, k, axis)
    kth = lax.slice_in_dim(top, k - 1, k, axis=axis)
    return keys >= kth, _decode_keys(top, x.dtype, shift, nb)
  values, indices = _top_pairs(x, k, axis)
  prev_v = lax.slice_in_dim(values, k - 1, k, axis=axis)
  prev_i = lax.slice_in_dim(indices, k - 1, k, axis=axis)
  idx = lax.broadcasted_iota(jnp.int32, x.shape, axis)
  mask = (x > prev_v) | ((x == prev_v) & (idx <= prev_i))
  return mask, values


def top_k(x: Array, k: int, axis: int = -1) -> Tuple[Array, Array]:
  """The k largest entries of `x` along `axis` and their positions, without sorting.

  Same selection as `top_k_mask` (ties -> lower index). Values are exact (read
  back from x at the selected positions). Under the packed float64 keys, entries
  closer than 2^-(52 - ceil(log2 m)) relative are ranked by index, so the values
  may be out of decreasing order by that much.

  Returns:
    values: x's dtype, `axis` of length k.
    indices: int32, `axis` of length k, positions along `axis`.
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  _check_k(k, m)
  if uses_radix(k, m, x.dtype):
    # Large k: the k values must come out sorted anyway; XLA's top_k does that.
    values, indices = lax.top_k(jnp.moveaxis(x, axis, -1), k)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices, -1, axis)
  if not _use_keys(x):
    return _top_pairs(x, k, axis)
  _, top, shift, nb = _top_keys(x, k, axis)
  low = (1 << 32) - 1 if x.dtype == jnp.float32 else (1 << nb) - 1
  indices = ((m - 1) - (top & low)).astype(jnp.int32)
  return jnp.take_along_axis(x, indices, axis=axis), indices


def densify(values: Array, indices: Array, m: int, axis: int = -1) -> Array:
  """Scatters `values` (k along `axis`) to positions `indices` of a length-m axis.

  Written as k fused comparisons against an iota (no scatter: cheap under vmap);
  indices along `axis` must be distinct.
  """
  axis = axis % values.ndim
  shape = list(values.shape)
  shape[axis] = m
  pos = lax.broadcasted_iota(jnp.int32, shape, axis)
  out = jnp.zeros(shape, values.dtype)
  for r in range(values.shape[axis]):
    v = lax.slice_in_dim(values, r, r + 1, axis=axis)
    i = lax.slice_in_dim(indices, r, r + 1, axis=axis)
    out = out + jnp.where(pos == i, v, 0)
  return out


def _threshold_from_sorted(values: Array, b: Array, axis: int) -> Array:
  """tau with sum_i [v_i - tau]_+ = b for values sorted in decreasing order, keepdims.

  tau = max over r of (v_1 + ... + v_r - b) / r (Duchi et al. 2008: the terms
  increase up to the support size and decrease after). A running sum over the
  k slices, unrolled: this serves the passes kernel only (k below the radix
  crossover, `uses_radix`), where it is cheaper than a cumsum.
  """
  kk = values.shape[axis]
  if kk > 2 * max(_RADIX_MIN_K.values()):
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
  ones (50,000 x 10 in the (n, m) layout: 0.08 ms against 0.27 ms). Along
  another axis two reductions (there the variadic one is slower: 0.57 against
  0.47 ms at 10,000 x 100).
  """
  values = jnp.where(active, x, 0)
  if not _minor_axis(x, axis):
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
  optimum: the threshold 0.125 -> 0.089 ms; solves to a fixed iteration
  count 10-20% faster on the radix rows). Folding by 2, 8 or 16 measured the
  same within noise.
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
  folded = mask is None and _minor_axis(x, axis) and x.shape[axis] >= _FOLD_MIN
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


def simplex_threshold(x: Array, b=1.0, axis: int = -1, mask: Array | None = None) -> Array:
  """tau such that sum_i [x_i - tau]_+ = b (over `mask` if given), keepdims.

  Michelot's algorithm (`_michelot`): no sort, a handful of passes over x.
  """
  axis = axis % x.ndim
  return _michelot(x, _expand(b, x, axis), axis, mask)[0]


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
  rows waited for its slowest one: solves to a fixed iteration count against
  batches of n / 4 rows, 2000 x 64 with k = 64 0.022 -> 0.019 s, 10,000 x 100
  with k = 100 (~60 of 100 binding) 0.96 -> 0.71 s; with all 1000 rows of
  1000 x 1000 binding at k = 32, one evaluation 1.46 against 1.50 ms.
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  b = _expand(b, x, axis)
  plain, count, _ = _michelot(x, b, axis, None)
  if k >= m:
    return plain, None

  binds = count > k

  def select(x, binds, b, plain):
    # The k-entry masks, and the closed-form tau where k binds.
    mask = threshold_top_k_mask(x, k, axis)
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


def projection_simplex(x: Array, b=1.0, axis: int = -1) -> Array:
  """Projection onto the b-scaled simplex {t >= 0, sum t = b} along `axis`."""
  tau = simplex_threshold(x, b, axis)
  return jnp.maximum(x - tau, 0)


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


def sparse_simplex_topk(x: Array, k: int, b=1.0, axis: int = -1) -> SparseSimplex:
  """Top-k sparsemax in compact form: only the k selected entries are touched
  after the selection passes, so the projection, the threshold and the
  conjugate's value cost O(k) per slice instead of extra passes over x.

  Requires 1 <= k <= m.
  """
  axis = axis % x.ndim
  b = _expand(b, x, axis)
  values, indices = top_k(x, k, axis)
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


def sparse_simplex_parts(x: Array, k: int, b=1.0, axis: int = -1):
  """Top-k sparsemax and its threshold, dense: (t, tau (keepdims)).

  For k >= m the plain simplex projection; for large k (`uses_radix`)
  `sparse_simplex_threshold`; otherwise the compact form, densified.
  """
  axis = axis % x.ndim
  m = x.shape[axis]
  if k >= m or uses_radix(k, m, x.dtype, _minor_axis(x, axis)):
    tau, mask = sparse_simplex_threshold(x, k, b, axis)
    active = x > tau
    if mask is not None:
      active = active & mask
    return jnp.where(active, x - tau, 0), tau
  sp = sparse_simplex_topk(x, k, b, axis)
  return densify(sp.values, sp.indices, m, axis), sp.tau


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
