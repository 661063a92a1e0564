"""Top-k selection without sorting, batched over leading axes.

The k largest entries of `x` along one `axis` (default: the last), ties to the
lower index (the set `lax.top_k` picks), as a mask (`top_k_mask`,
`threshold_top_k_mask`) or as values and positions (`top_k`), plus the pieces
the batched router solver uses (`distinct_top_values`, `count_at_least`).

Sorting is slow on CPU (see benchmarks/RESULTS.md), so two kernels, chosen by
`uses_radix`: for small k, k reduction passes find the k largest values in
decreasing order; for large k, a radix selection on order-preserving integer
keys finds the k-th value in at most 32 (float32) or 64 (float64) bits whatever
k is (fewer when the k-th and (k+1)-th values differ early in their bits), one
bit per counting pass, or two along the contiguous axis (variadic reductions).
`top_k_mask` forms the selection mask densely by comparison; `top_k` reads the
positions off the packed keys and gathers the k exact values, so that what
follows a selection (the projections of `ot.projections`) costs O(k) per slice.

Differentiation: a selection is piecewise constant, so masks and indices
(bool, int) carry no derivative (JAX gives them float0 tangents, and
`jax.jacfwd` refuses non-float outputs); the selected values are entries of
x, and their derivative is dx at the selected positions, in both modes.
Selection only compares entries, exact in every dtype: half precision is
selected as it is (`threshold_top_k_mask` compares it as float32).
"""
from __future__ import annotations

import functools
from typing import Tuple

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array

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
  in its low nb bits (`_sort_keys`). Several times faster than k passes over
  the whole slice (docs/OT.md, "Kernel timings").
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
  pass in one variadic reduction, which costs about what one count does there
  (docs/OT.md, "Kernel timings"); half the passes).

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
    values = _decode_keys(top, x.dtype, shift, nb)
    return keys >= kth, _values_of(values, x, _key_indices(top, m, x.dtype, nb), axis)
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
  indices = _key_indices(top, m, x.dtype, nb)
  return jnp.take_along_axis(x, indices, axis=axis), indices


def _key_indices(top: Array, m: int, dtype, nb: int) -> Array:
  """int32 positions of packed keys (`_sort_keys`: m - 1 - index in the low bits)."""
  low = (1 << 32) - 1 if dtype == jnp.float32 else (1 << nb) - 1
  return ((m - 1) - (top & low)).astype(jnp.int32)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _values_of(values: Array, x: Array, indices: Array, axis: int) -> Array:
  """`values`, read off packed keys, with the derivative of x at `indices`.

  Bits of keys carry no derivative: without this rule the values of
  `top_k_mask` differentiated to zero. The indices cost nothing unless
  differentiated (only the rule reads them; XLA drops them otherwise).
  """
  del x, indices, axis
  return values


@_values_of.defjvp
def _values_of_jvp(axis, primals, tangents):
  values, _, indices = primals
  return values, jnp.take_along_axis(tangents[1], indices, axis=axis)


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

