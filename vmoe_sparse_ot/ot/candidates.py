"""`batched_semi_dual_adam_candidates`: the batched Adam semi-dual on a few rows per column.

The same iterates as `batched.batched_semi_dual_adam` (Adam from zero, top-k
sparse simplex projection of each column u_j = (alpha - c_j) / gamma), with
each step's selection run on R candidate rows per column instead of all m,
and each column's k-th value found from the previous step's instead of from
scratch:

- **The walk** (`_walk`). Alpha moves by about the learning rate per step, so
  a column's k-th value moves by a few ranks. One pass counts the candidates
  at or above the last k-th value; each further pass moves every column one
  value up or down (the next larger or smaller candidate), until each stands
  on its k-th. At the router's B/32 shapes (m = 400, k = 28, R = 2k) that is
  about 7 passes a step over (R, N) instead of k = 28 over (m, N). Ties, which
  the walk counts once per value, are settled by counting (`_settle_ties`).
- **The candidates stay right.** A column's top k lies among its candidates
  when no other row reaches the k-th candidate value. Every step checks that
  with one pass over the other rows, whose costs are kept with the candidates'
  set to +inf so the pass needs no mask; it keeps the maximum of each block of
  16 rows. Where an outside row reaches the k-th value, the best outside row
  (looked for in the block holding the maximum only) replaces the weakest
  candidate, one per column per round, until the check holds.
- **The threshold in closed form.** Where k binds (every one of the k entries
  gets mass, the router's case), tau = (sum of the top k - b_j) / k; the
  members are the entries >= the k-th, ties going to the lower rows as in the
  full path. A column where k does not bind, or a check that does not settle
  within `_MAX_REPAIRS` rounds, sends the step to the full path.

The plans equal the full path's up to rounding: the same members, tau summed
in another order.

Shapes: G problems, m rows, n columns per problem, N = n * G columns in all
(expert-major, as in `batched`), R candidates per column.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from vmoe_sparse_ot.ot import batched
from vmoe_sparse_ot.ot import optim
from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import validation

Array = jax.Array

# Rounds of the candidates' repair per step before the step takes the full path.
_MAX_REPAIRS = 8
# The check keeps the maximum of each block of _BLOCK rows, so that a repair
# looks for the best outside row in one block instead of all m rows.
_BLOCK = 16


def default_num_candidates(k: int, m: int) -> int:
  """R = 2 k rows per column (at most m - 1): fewer let outside rows enter on
  most steps, more cost more per step (docs/OT.md, "Kernel timings")."""
  return min(m - 1, 2 * k)


def applies(k: int, m: int, num_candidates: int) -> bool:
  """Whether the candidate path runs: more candidates than k, fewer than m."""
  return k < num_candidates < m


def _settle_ties(u: Array, w: Array, k: int):
  """(w, above, at_least): w moved until it is each column's k-th largest
  entry of u (R, N), with above < k entries above it and at_least >= k at or
  above it (1, N each)."""
  def counts(w):
    return (jnp.sum(u > w, axis=0, keepdims=True, dtype=jnp.int32),
            jnp.sum(u >= w, axis=0, keepdims=True, dtype=jnp.int32))

  def cond(carry):
    _, (above, at_least) = carry
    return jnp.any((above >= k) | (at_least < k))

  def body(carry):
    w, (above, at_least) = carry
    higher = jnp.min(jnp.where(u > w, u, jnp.inf), axis=0, keepdims=True)
    lower = jnp.max(jnp.where(u < w, u, -jnp.inf), axis=0, keepdims=True)
    w = jnp.where(above >= k, higher, jnp.where(at_least < k, lower, w))
    return w, counts(w)

  w, (above, at_least) = lax.while_loop(cond, body, (w, counts(w)))
  return w, above, at_least


def _walk(u: Array, w: Array, k: int) -> Array:
  """Each column's k-th largest entry of u (R, N), walked from a guess w (1, N).

  Up (to the (c - k + 1)-th smallest entry >= w) where c >= k entries are >= w,
  else down (to the (k - c)-th largest entry < w); up is the same walk on -u.
  One pass per rank moved: exact where the values crossed are distinct, which
  the caller checks (`_settle_ties` finishes the others).
  """
  c = jnp.sum(u >= w, axis=0, keepdims=True, dtype=jnp.int32)
  up = c >= k
  todo = jnp.where(up, c - k + 1, k - c)
  sign = jnp.where(up, -1, 1).astype(u.dtype)
  # Up's first move may land on w itself (an entry >= w): strict "<" on -u
  # against the next float above -w.
  lim = jnp.where(up, jnp.nextafter(-w, jnp.inf), w)
  # Per-column values: materialised before the full-size passes read them
  # (fused, XLA would recompute them for every entry).
  sign, lim, todo = lax.optimization_barrier((sign, lim, todo))

  def cond(carry):
    return jnp.any(carry[1] > 0)

  def body(carry):
    lim, todo = carry
    x = sign * u
    nxt = jnp.max(jnp.where(x < lim, x, -jnp.inf), axis=0, keepdims=True)
    return jnp.where(todo > 0, nxt, lim), todo - 1

  lim, _ = lax.while_loop(cond, body, (lim, todo))
  return sign * lim


def batched_semi_dual_adam_candidates(C: Array, a: Array, b: Array, k: int, gamma,
                                      num_steps: int, learning_rate,
                                      num_candidates: int | None = None, *,
                                      return_alpha: bool = False):
  """Plans (G, m, n) of G sparsity-constrained semi-duals after `num_steps` Adam steps.

  Arguments and result as `batched_semi_dual_adam` (whose plans these equal up
  to rounding); num_candidates: R, rows kept per column (static; None:
  `default_num_candidates`). Where the candidates cannot help (`applies`),
  `batched_semi_dual_adam` itself runs. return_alpha: also return alpha (G, m).
  float16 / bfloat16 inputs are computed and returned in float32
  (`ot.precision`). Raises ValueError when differentiated where the candidates
  apply (their bounds step with `nextafter`, which has no derivative):
  `batched_semi_dual_adam` is the differentiable form of the same iterates.
  """
  C, a, b, gamma, learning_rate = precision.upcast((C, a, b, gamma, learning_rate))
  g, m, n = C.shape
  r = default_num_candidates(k, m) if num_candidates is None else num_candidates
  if not applies(k, m, r):
    return batched.batched_semi_dual_adam(C, a, b, k, gamma, num_steps, learning_rate,
                                          return_alpha=return_alpha)
  C, a, b, gamma, learning_rate = validation.not_differentiable(
      "ot.batched_semi_dual_adam_candidates cannot be differentiated: use "
      "ot.batched_semi_dual_adam (the same iterates), or stop_gradient its inputs",
      (C, a, b, gamma, learning_rate))
  big_n = n * g
  dtype = C.dtype
  ct = (jnp.transpose(C, (1, 2, 0)) / gamma).reshape(m, big_n)          # (m, N)
  b_cols = b.T.reshape(1, big_n)
  group = jnp.arange(big_n, dtype=jnp.int32) % g                        # column -> problem
  cols = jnp.arange(big_n, dtype=jnp.int32)
  a_rows = a.T                                                          # (m, G)

  def full_u(alpha_s, costs):
    # As `batched`'s make_u (alpha / gamma, then minus C / gamma): the same bits.
    rows = costs.shape[0]
    return (alpha_s[:rows, None, :] - costs.reshape(rows, n, g)).reshape(rows, big_n)

  blocks = -(-m // _BLOCK)
  padded = blocks * _BLOCK

  def block_max(alpha_s, outside):
    """(blocks, N): each block's largest u over the rows outside the candidates."""
    alpha_p = jnp.pad(alpha_s, ((0, padded - m), (0, 0)))
    u = full_u(alpha_p, outside)                                         # (padded, N)
    return jnp.max(u.reshape(blocks, _BLOCK, big_n), axis=1)

  def cand_u(alpha_s, cand):
    return alpha_s.reshape(m * g)[cand["rows"] * g + group] - cand["costs"]

  def first_candidates():
    # Each column's R cheapest rows (only the positions: slicing top_k's
    # values makes XLA sort whole columns instead).
    rows = lax.top_k(-ct.T, r)[1].T.astype(jnp.int32)                   # (R, N)
    col = jnp.broadcast_to(cols, (r, big_n))
    # The other rows' costs (the candidates' and the padding rows' +inf).
    outside = jnp.pad(ct, ((0, padded - m), (0, 0)), constant_values=jnp.inf)
    return {"rows": rows, "costs": ct[rows, col], "outside": outside.at[rows, col].set(jnp.inf)}

  def repair(alpha_s, cand, u_c, w, maxima):
    """Where a row outside reaches w, the best one replaces the weakest candidate."""
    out = jnp.max(maxima, axis=0)
    short = out >= w[0]
    # The best outside row: the lowest of the first block holding the maximum.
    block_ids = lax.broadcasted_iota(jnp.int32, maxima.shape, 0)
    block = jnp.min(jnp.where(maxima == out, block_ids, blocks), axis=0)
    rows_b = jnp.minimum(block * _BLOCK + jnp.arange(_BLOCK, dtype=jnp.int32)[:, None],
                         padded - 1)                                     # (_BLOCK, N)
    alpha_p = jnp.pad(alpha_s, ((0, padded - m), (0, 0))).reshape(padded * g)
    u_b = alpha_p[rows_b * g + group] - cand["outside"][rows_b, cols]
    best = jnp.min(jnp.where(u_b == out, rows_b, padded), axis=0)        # ties: lower row
    lowest = jnp.min(u_c, axis=0, keepdims=True)
    weakest = jnp.min(jnp.where(u_c == lowest, lax.broadcasted_iota(jnp.int32, u_c.shape, 0),
                                r), axis=0)
    old = cand["rows"][weakest, cols]
    new = jnp.where(short, best, old)
    # One scatter: the old row's cost back outside, the new row's out (where
    # nothing changes, both write +inf to the old row).
    outside = cand["outside"].at[jnp.concatenate([old, new]), jnp.concatenate([cols, cols])].set(
        jnp.concatenate([jnp.where(short, ct[old, cols], jnp.inf), jnp.full_like(w[0], jnp.inf)]))
    return {"rows": cand["rows"].at[weakest, cols].set(new),
            "costs": cand["costs"].at[weakest, cols].set(ct[new, cols]),
            "outside": outside}

  def kth(u_c, w):
    return _settle_ties(u_c, _walk(u_c, w, k), k)     # (w, above, at_least)

  def settle(alpha_s, cand, w):
    """(cand, u_c, (w, above, at_least), ok): candidates holding each
    column's top k (ok False: not within _MAX_REPAIRS rounds), w its k-th."""
    u_c = cand_u(alpha_s, cand)
    w, above, at_least = kth(u_c, w)

    def reached(found, maxima):
      return jnp.any(jnp.max(maxima, axis=0) >= found[0][0])

    def cond(carry):
      i, _, _, found, maxima = carry
      return (i < _MAX_REPAIRS) & reached(found, maxima)

    def body(carry):
      i, cand, u_c, (w, _, _), maxima = carry
      cand = repair(alpha_s, cand, u_c, w, maxima)
      u_c = cand_u(alpha_s, cand)
      found = kth(u_c, w)
      return i + 1, cand, u_c, found, block_max(alpha_s, cand["outside"])

    _, cand, u_c, found, maxima = lax.while_loop(
        cond, body, (0, cand, u_c, (w, above, at_least), block_max(alpha_s, cand["outside"])))
    return cand, u_c, found, ~reached(found, maxima)

  def project(alpha_s, cand, w):
    """(cand, w, t_c (R, N), ok): the candidates' projection; ok False: full path."""
    cand, u_c, (w, above, at_least), ok = settle(alpha_s, cand, w)
    total = jnp.sum(jnp.where(u_c > w, u_c, 0), axis=0, keepdims=True) + (k - above) * w
    tau = (total - b_cols) / k
    binds = jnp.all(tau <= w)         # all k entries keep mass: tau in closed form

    def lower_rows_first(u_c):
      # Ties at w: the lower rows, as the full path.
      at = u_c == w
      key = jnp.where(at, cand["rows"], m)
      rank = jnp.sum(key[None, :, :] < key[:, None, :], axis=1)
      return (u_c > w) | (at & (rank < k - above))

    member = lax.cond(jnp.any(at_least > k), lower_rows_first, lambda u_c: u_c >= w, u_c)
    return cand, w, jnp.where(member, u_c - tau, 0), ok & binds

  def full_plan(alpha_s):
    return batched._sparse_projection(full_u(alpha_s, ct), k, b_cols, lambda t: t)

  def step(i, carry):
    alpha, mu, nu, cand, w = carry
    alpha_s = alpha / gamma
    cand, w, t_c, ok = project(alpha_s, cand, w)
    sums = lax.cond(
        ok,
        lambda: jnp.zeros((m * g,), dtype).at[cand["rows"] * g + group].add(t_c).reshape(m, g),
        lambda: jnp.sum(full_plan(alpha_s).reshape(m, n, g), axis=1))
    alpha, mu, nu = optim.adam_update(i, alpha, mu, nu, a_rows - sums, learning_rate)
    return alpha, mu, nu, cand, w

  zeros = jnp.zeros((m, g), dtype)
  w0 = jnp.full((1, big_n), jnp.inf, dtype)
  alpha, _, _, cand, w = lax.fori_loop(0, num_steps, step,
                                       (zeros, zeros, zeros, first_candidates(), w0))
  alpha_s = alpha / gamma
  cand, w, t_c, ok = project(alpha_s, cand, w)
  col = jnp.broadcast_to(cols, (r, big_n))
  plan = lax.cond(ok, lambda: jnp.zeros((m, big_n), dtype).at[cand["rows"], col].set(t_c),
                  lambda: full_plan(alpha_s))
  plan = jnp.transpose(plan.reshape(m, n, g), (2, 0, 1))
  return (plan, alpha.T) if return_alpha else plan
