"""`batched_semi_dual_adam_candidates`: the batched Adam semi-dual on a few rows per column.

The same iterates as `batched.batched_semi_dual_adam` (Adam from zero, top-k
sparse simplex projection of each column u_j = (alpha - c_j) / gamma), with
each step's selection run on R candidate rows per column instead of all m.
A column's top k lies among its candidates when no other row reaches the k-th
largest candidate; one counting pass over the full (m, N) array checks that
every step, so the candidates are never trusted blindly. Where the check fails
the best outside row replaces the weakest candidate, one swap per column per
round, until it holds; where a tie straddles the k-th value, or the swaps do
not settle within `_MAX_SWAPS` rounds, the step falls back to the full
selection. The plans then equal the full path's up to the rounding of the row
sums (the candidates' values, their order and the thresholds are bit for bit
the same).

Why: the k "next maximum" passes of the full selection dominate a step, and
on R = 64 of m = 400 rows they cost 0.12 ms instead of 3.1 ms (the router's
B/32 batch, 512 columns, k = 28, one thread); the check is one pass. Alpha
moves by about the learning rate per step, so the candidates change rarely
(64 of 400 rows: swap rounds in about 10 of 50 steps).

Shapes: G problems, m rows, n columns per problem, N = n * G columns in all
(expert-major, as in `batched`), R candidates per column.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from vmoe_sparse_ot.ot import batched
from vmoe_sparse_ot.ot import optim
from vmoe_sparse_ot.ot import selection

Array = jax.Array

# Swap rounds per step before the step falls back to the full selection.
_MAX_SWAPS = 8


def default_num_candidates(k: int, m: int) -> int:
  """R = 4 k rows per column, at most m / 2. At the router's B/32 batch (k =
  28, m = 400) a column's top k left R = 48 candidates in 21 of 50 steps, R =
  64 in 10, R = 96 in 4; 50 steps took 129 ms with R = 64 and 110 ms with R =
  96 (one thread, loaded machine): the swaps cost more than the longer
  candidate lists."""
  return min(m // 2, 4 * k)


def applies(k: int, m: int, num_candidates: int, dtype) -> bool:
  """Whether the candidate path helps: R well below m, and the passes kernel
  (the radix kernel's cost does not grow with k, nor would it shrink with R)."""
  return k < num_candidates <= m // 2 and not selection.uses_radix(k, m, dtype)


def _top_k_on(u_c: Array, k: int, b: Array):
  """(t_c (R, N), kth (1, N), tie (1, N) bool) of the candidates' top-k projection."""
  stats = batched._top_k_stats(u_c, k, b)
  tau, kth, tie = stats[0:1], stats[1:2], stats[3:4] > 0
  return jnp.where(u_c >= kth, jnp.maximum(u_c - tau, 0), 0), kth, tie


def batched_semi_dual_adam_candidates(C: Array, a: Array, b: Array, k: int, gamma,
                                      num_steps: int, learning_rate,
                                      num_candidates: int | None = None) -> Array:
  """Plans (G, m, n) of G sparsity-constrained semi-duals after `num_steps` Adam steps.

  Arguments and result as `batched_semi_dual_adam` (whose plans these equal up
  to rounding); num_candidates: R, rows kept per column (static; None:
  `default_num_candidates`). Where the candidates cannot help (`applies`),
  `batched_semi_dual_adam` itself runs.
  """
  g, m, n = C.shape
  r = default_num_candidates(k, m) if num_candidates is None else num_candidates
  if not applies(k, m, r, C.dtype):
    return batched.batched_semi_dual_adam(C, a, b, k, gamma, num_steps, learning_rate)
  big_n = n * g
  ct = (jnp.transpose(C, (1, 2, 0)) / gamma).reshape(m, big_n)          # (m, N)
  b_cols = b.T.reshape(1, big_n)
  group = jnp.arange(big_n, dtype=jnp.int32) % g                        # column -> problem
  col = jnp.broadcast_to(jnp.arange(big_n, dtype=jnp.int32), (r, big_n))
  a_rows = a.T                                                          # (m, G)

  def full_u(alpha):
    # As `batched`'s make_u (alpha / gamma, then minus C / gamma): the same bits.
    return (alpha[:, None, :] / gamma - ct.reshape(m, n, g)).reshape(m, big_n)

  def cand_u(alpha, rows, cc):
    return (alpha / gamma).reshape(m * g)[rows * g + group] - cc

  def outside_count(alpha, u_c, kth):
    # Rows outside the candidates at or above the candidates' k-th value: all
    # such rows less the candidates among them (no mask to read in this pass).
    every = jnp.sum(full_u(alpha) >= kth, axis=0, dtype=jnp.int32)
    return every - jnp.sum(u_c >= kth, axis=0, dtype=jnp.int32)

  def swap(alpha, cand, u_c, short):
    """Where `short`, the best outside row replaces the weakest candidate."""
    rows, cc, inside = cand
    best = jnp.argmax(jnp.where(inside, -jnp.inf, full_u(alpha)), axis=0).astype(jnp.int32)
    weakest = jnp.argmin(u_c, axis=0)                                    # (N,)
    cols = jnp.arange(big_n)
    old = rows[weakest, cols]
    rows = rows.at[weakest, cols].set(jnp.where(short, best, old))
    cc = cc.at[weakest, cols].set(jnp.where(short, ct[best, cols], cc[weakest, cols]))
    inside = inside.at[old, cols].set(~short).at[best, cols].set(short | inside[best, cols])
    return rows, cc, inside

  def project(alpha, cand):
    """(t_c (R, N), candidates, ok): the step's projection on the candidates,
    after swapping until they hold every column's top k; ok False: fall back."""
    def attempt(i, cand):
      u_c = cand_u(alpha, cand[0], cand[1])
      t_c, kth, tie = _top_k_on(u_c, k, b_cols)
      return i, cand, t_c, (outside_count(alpha, u_c, kth) > 0, tie, u_c)

    def cond(state):
      i, _, _, (short, tie, _) = state
      return (i < _MAX_SWAPS) & jnp.any(short) & ~jnp.any(tie)

    def body(state):
      i, cand, _, (short, _, u_c) = state
      return attempt(i + 1, swap(alpha, cand, u_c, short))

    _, cand, t_c, (short, tie, _) = lax.while_loop(cond, body, attempt(0, cand))
    return t_c, cand, ~jnp.any(short) & ~jnp.any(tie)

  def dense(t_c, rows):
    return jnp.zeros((m, big_n), t_c.dtype).at[rows, col].set(t_c)

  def full_plan(alpha):
    return batched._sparse_projection(full_u(alpha), k, b_cols, lambda t: t)

  def plan_of(alpha, cand):
    t_c, cand, ok = project(alpha, cand)
    return lax.cond(ok, lambda: dense(t_c, cand[0]), lambda: full_plan(alpha))

  def row_sums(alpha, cand):
    t_c, cand, ok = project(alpha, cand)

    def from_candidates():
      sums = jnp.zeros((m * g,), t_c.dtype).at[cand[0] * g + group].add(t_c)
      return sums.reshape(m, g)

    def from_full():
      return jnp.sum(full_plan(alpha).reshape(m, n, g), axis=1)

    return lax.cond(ok, from_candidates, from_full), cand

  def step(i, carry):
    alpha, mu, nu, cand = carry
    sums, cand = row_sums(alpha, cand)
    alpha, mu, nu = optim.adam_update(i, alpha, mu, nu, a_rows - sums, learning_rate)
    return alpha, mu, nu, cand

  zeros = jnp.zeros((m, g), C.dtype)
  # First candidates: each column's R largest entries at alpha = 0, once.
  # Carried: their rows, their costs / gamma, and the (m, N) mask of them.
  rows = lax.top_k(-ct.T, r)[1].T.astype(jnp.int32)                     # (R, N)
  cand = (rows, ct[rows, col], jnp.zeros((m, big_n), bool).at[rows, col].set(True))
  alpha, _, _, cand = lax.fori_loop(0, num_steps, step, (zeros, zeros, zeros, cand))
  plan = plan_of(alpha, cand)
  return jnp.transpose(plan.reshape(m, n, g), (2, 0, 1))
