"""Many small sparsity-constrained semi-duals at once, Adam from zero (router-sized).

`batched_semi_dual_adam` computes the same plans as

    jax.vmap(lambda c, a, b: ot.solve(a, b, c, SparsityConstrained(k, gamma),
        formulation="semi_dual", solver="adam", max_iter=N, tol=0.0,
        learning_rate=lr, init=jnp.zeros_like(a)).plan)

-- Adam ascent on alpha from 0, plan columns t_j = top-k sparse projection of
u_j = (alpha - c_j) / gamma onto the b_j-scaled simplex, ties at the k-th value
broken by the lower index -- but several times faster on CPU at the sizes of a
MoE router (G ~ 100 groups of S = 64 tokens, E = 8 experts, k = 16), where it
runs inside every training step. What XLA's CPU backend rewards here:

- one (m, N) array u per Adam step, N = n * G columns (expert-major), carried by
  the loop so that it is built once and the passes below read a plain buffer;
- for small k, the k largest distinct values of each column from
  `selection.distinct_top_values` (tree-of-maxima passes); the threshold in
  closed form from those sorted values (`projections._threshold_from_sorted`),
  and with ties (equal values in one column, common in float32) from counts of
  the entries >= each value; for large k (`selection.uses_radix`), the radix
  selection and the closed-form threshold of the columns where k binds, as in
  `solve` (`projections.sparse_simplex_threshold`);
- small per-column results cross a `lax.cond` or loop boundary before a
  full-size consumer uses them, so XLA cannot fuse (and so recompute) them into
  every entry's computation;
- the Adam update is `optim.adam_update`, on (m, G) arrays.

Shapes: G problems, m rows (the constrained axis of each column), n columns per
problem, N = n * G columns in all.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from vmoe_sparse_ot.ot import optim
from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import projections
from vmoe_sparse_ot.ot import selection

Array = jax.Array


def _stats(values: Array, counts: Array, k: int, b: Array) -> Array:
  """(4, N) [tau, kth, above, tie] of the top-k multiset of each column, ties allowed.

  values (k, N): distinct values, decreasing; counts (k, N): #entries >= each.
  kth: the k-th largest entry; above: #entries > kth; tie: 1 where the entries
  equal to kth do not all fit in the top k (the lower indices then win). tau =
  max over prefixes of (prefix sum - b) / prefix length, the simplex threshold
  of the multiset; a run of equal values is never split by the support, so only
  run ends (and the cut at k) are candidates.
  """
  total = jnp.zeros_like(b)
  tau = jnp.full_like(b, -jnp.inf)
  kth, above, tie, prev = (jnp.zeros_like(b),) * 4
  for r in range(k):
    v, count = values[r:r + 1], counts[r:r + 1]
    before, after = jnp.minimum(prev, k), jnp.minimum(count, k)
    fresh = after > before          # false once k entries are taken (and for -inf fill)
    total = total + jnp.where(fresh, (after - before) * v, 0)
    tau = jnp.where(fresh, jnp.maximum(tau, (total - b) / after), tau)
    kth = jnp.where(fresh, v, kth)
    above = jnp.where(fresh, before, above)
    tie = jnp.where(fresh, (count > k).astype(b.dtype), tie)
    prev = count
  return jnp.concatenate([tau, kth, above, tie])


def _top_k_stats(u: Array, k: int, b: Array) -> Array:
  """(4, N) [tau, kth, above, tie] of each column of u (m, N); b (1, N) the masses."""
  values = selection.distinct_top_values(u, k)
  no_ties = jnp.all(selection.count_at_least(u, values[-1:]) == k)

  def sorted_rule(u, values):
    tau = projections._threshold_from_sorted(values, b, axis=0)
    zeros = jnp.zeros_like(b)
    return jnp.concatenate([tau, values[k - 1:k], zeros + (k - 1), zeros])

  return lax.cond(no_ties, sorted_rule,
                  lambda u, values: _stats(values, selection.count_at_least(u, values), k, b),
                  u, values)


def _members_with_ties(u: Array, k: int, stats: Array) -> Array:
  """bool (m, N): the top k of each column, the lower indices first among kth's ties."""
  kth, above = stats[1:2], stats[2:3]
  at = u == kth
  ranks = jnp.cumsum(at, axis=0, dtype=jnp.int32)         # 1-based among the ties
  return (u > kth) | (at & (ranks <= (k - above).astype(jnp.int32)))


def _sparse_projection(u: Array, k: int, b: Array, reduce) -> Array:
  """reduce(t) for t (m, N), the top-k sparse simplex projection of u's columns."""
  m = u.shape[0]
  if k >= m or selection.uses_radix(k, m, u.dtype):
    tau, mask = projections.sparse_simplex_threshold(u, k, b, axis=0)
    active = u > tau if mask is None else mask & (u > tau)
    return reduce(jnp.where(active, u - tau, 0))
  stats = _top_k_stats(u, k, b)

  def project(u, stats, member):
    return reduce(jnp.where(member, jnp.maximum(u - stats[0:1], 0), 0))

  # The cond also keeps the per-column stats a materialised operand of t's fusion.
  return lax.cond(
      jnp.any(stats[3] > 0),
      lambda u, stats: project(u, stats, _members_with_ties(u, k, stats)),
      lambda u, stats: project(u, stats, u >= stats[1:2]),
      u, stats)


def batched_semi_dual_adam(C: Array, a: Array, b: Array, k: int, gamma,
                           num_steps: int, learning_rate, *, return_alpha: bool = False):
  """Plans (G, m, n) of G sparsity-constrained semi-duals after `num_steps` Adam steps.

  Args:
    C: (G, m, n) costs (any finite values); a: (G, m) row marginals; b: (G, n)
      column marginals (each plan column has mass b_j and at most k nonzeros).
    k: static int >= 1. gamma: > 0 (may be traced). num_steps: static int >= 0.
    learning_rate: Adam step size; alpha starts at 0 (`ot.solve` with
      init=zeros; its default start is `c_transform_start`).

  Returns:
    (G, m, n) plans, equal to vmap(ot.solve(..., solver="adam",
    formulation="semi_dual", tol=0.0, max_iter=num_steps, init=zeros).plan) up
    to rounding; in C's dtype, float32 for float16 / bfloat16 inputs (computed
    in float32: `ot.precision`); with return_alpha, (plans, alpha (G, m)) (the
    final iterate). Differentiable through the unrolled steps.
  """
  C, a, b, gamma, learning_rate = precision.upcast((C, a, b, gamma, learning_rate))
  g, m, n = C.shape
  ct = jnp.transpose(C, (1, 2, 0)) / gamma                               # (m, n, G)
  b_cols = b.T.reshape(1, n * g)

  def make_u(alpha):                                                     # alpha (m, G)
    # Kept 3-D: broadcasting alpha over the middle axis vectorises; the (m, N)
    # view is a free reshape of the carried buffer.
    return alpha[:, None, :] / gamma - ct                                # (m, n, G)

  def row_sums(t):                                                       # (m, N) -> (m, G)
    t = t.reshape(m, n, g)
    return sum(t[:, j] for j in range(n))

  a_rows = a.T                                                           # (m, G), once

  def step(i, carry):
    alpha, mu, nu, u = carry
    grad = a_rows - _sparse_projection(u.reshape(m, n * g), k, b_cols, row_sums)
    alpha, mu, nu = optim.adam_update(i, alpha, mu, nu, grad, learning_rate)
    return alpha, mu, nu, make_u(alpha)

  zeros = jnp.zeros((m, g), C.dtype)
  alpha, _, _, u = lax.fori_loop(0, num_steps, step, (zeros, zeros, zeros, make_u(zeros)))
  plan = _sparse_projection(u.reshape(m, n * g), k, b_cols, lambda t: t)
  plan = jnp.transpose(plan.reshape(m, n, g), (2, 0, 1))
  return (plan, alpha.T) if return_alpha else plan
