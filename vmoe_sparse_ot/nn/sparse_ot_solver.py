"""The sparse_ot router's inner solver: G small semi-duals at once, CPU-friendly.

Computes the same thing as `jax.vmap(ot.solve(a, b, C, SparsityConstrained(k,
gamma), formulation="semi_dual", solver="adam", max_iter=N, tol=0.0,
learning_rate=lr).plan)` -- Adam ascent on alpha from 0, plan columns
t_j = top-k sparse projection of u_j = (alpha - c_j) / gamma onto the
b_j-scaled simplex, ties at the k-th value broken by the lower index -- but much
faster on CPU at router sizes (G ~ 100 groups, S = 64 tokens, E = 8 experts,
k = C = 16), where the solver runs inside every training step. What XLA's CPU
backend rewards here:

- one (m, N) array u per Adam step, N = n * G columns (expert-major), carried
  by the loop so that it is built once and the passes below read a plain buffer;
- the k largest distinct values of each column come from k "next smaller
  maximum" passes, each a halving tree of elementwise maxima: XLA fuses the
  tree with its where(), whereas a reduce op would first write the full where()
  array (the passes are most of the solver's time);
- the threshold of the projection comes in closed form from those sorted values
  (the sorted-prefix rule, no Michelot loop); ties (equal values in one column,
  common in float32) only add a count of the entries >= each value;
- small per-column results cross a `lax.cond` or loop boundary before a
  full-size consumer uses them, so XLA cannot fuse (and so recompute) them into
  every entry's computation;
- the Adam update is `ot.optim.adam`'s, written out on (m, G) arrays.

Shapes: G problems, m rows (the constrained axis of each column), n columns per
problem, N = n * G columns in all. Tested against `ot.solve` in float64.
"""
import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot

Array = jax.Array

# ot.optim.adam's defaults (the reference this solver must reproduce).
_B1, _B2, _EPS = 0.9, 0.999, 1e-8


def _tree(x: Array, op) -> Array:
  """(1, ...): x (m, ...) reduced along axis 0 by a halving tree of elementwise `op`."""
  while x.shape[0] > 1:
    h = x.shape[0] // 2
    y = op(x[:h], x[h:2 * h])
    x = jnp.concatenate([y, x[2 * h:]]) if x.shape[0] % 2 else y
  return x


def distinct_top_values(u: Array, k: int) -> Array:
  """(k, N): the k largest distinct values of each column of u (m, N), decreasing.

  -inf once a column has fewer than k distinct values. One pass over u per value;
  the loop keeps each pass a separate fusion that reads u from memory.
  """
  n_cols = u.shape[1]

  def body(r, carry):
    v, values = carry
    v = _tree(jnp.where(u < v, u, -jnp.inf), jnp.maximum)
    return v, jax.lax.dynamic_update_slice_in_dim(values, v, r, 0)

  init = (jnp.full((1, n_cols), jnp.inf, u.dtype), jnp.zeros((k, n_cols), u.dtype))
  return jax.lax.fori_loop(0, k, body, init)[1]


def _counts_at(u: Array, values: Array) -> Array:
  """(k, N): how many entries of each column of u (m, N) are >= each of `values` (k, N)."""
  return _tree((u[:, None] >= values[None]).astype(u.dtype), jnp.add)[0]


def _stats_no_ties(values: Array, k: int, b: Array) -> Array:
  """(4, N) [tau, kth, above, tie] when the top k of each column are k distinct values.

  tau = max_r (sum of the r largest - b) / r is the simplex threshold of the k
  values (each candidate is <= tau, with equality at the support size).
  """
  cumsum = jnp.zeros_like(b)
  tau = jnp.full_like(b, -jnp.inf)
  for r in range(k):
    cumsum = cumsum + values[r:r + 1]
    tau = jnp.maximum(tau, (cumsum - b) / (r + 1))
  zeros = jnp.zeros_like(b)
  return jnp.concatenate([tau, values[k - 1:k], zeros + (k - 1), zeros])


def _stats(values: Array, counts: Array, k: int, b: Array) -> Array:
  """(4, N) [tau, kth, above, tie] of the top-k multiset of each column, ties allowed.

  values (k, N): distinct values, decreasing; counts (k, N): #entries >= each.
  kth: the k-th largest entry; above: #entries > kth; tie: 1 where the entries
  equal to kth do not all fit in the top k (the lower indices then win). tau is
  the threshold rule of `_stats_no_ties` over the multiset; a run of equal values
  is never split by the support, so only run ends (and the cut at k) are candidates.
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
  values = distinct_top_values(u, k)
  no_ties = jnp.all(_tree((u >= values[-1:]).astype(u.dtype), jnp.add) == k)
  return jax.lax.cond(no_ties,
                      lambda u, values: _stats_no_ties(values, k, b),
                      lambda u, values: _stats(values, _counts_at(u, values), k, b),
                      u, values)


def _members_with_ties(u: Array, k: int, stats: Array) -> Array:
  """bool (m, N): the top k of each column, the lower indices first among kth's ties."""
  kth, above = stats[1:2], stats[2:3]
  at = u == kth
  ranks = jnp.cumsum(at, axis=0, dtype=jnp.int32)         # 1-based among the ties
  return (u > kth) | (at & (ranks <= (k - above).astype(jnp.int32)))


def top_k_members(u: Array, k: int) -> Array:
  """bool (m, N): the k largest entries of each column of u; ties -> lower index."""
  if k >= u.shape[0]:
    return jnp.ones(u.shape, bool)
  return _members_with_ties(u, k, _top_k_stats(u, k, jnp.zeros((1, u.shape[1]), u.dtype)))


def _sparse_projection(u: Array, k: int, b: Array, reduce) -> Array:
  """reduce(t) for t (m, N), the top-k sparse simplex projection of u's columns."""
  if k >= u.shape[0]:
    return reduce(jnp.maximum(u - ot.simplex_threshold(u, b, axis=0), 0))
  stats = _top_k_stats(u, k, b)

  def project(u, stats, member):
    return reduce(jnp.where(member, jnp.maximum(u - stats[0:1], 0), 0))

  # The cond also keeps the per-column stats a materialised operand of t's fusion.
  return jax.lax.cond(
      jnp.any(stats[3] > 0),
      lambda u, stats: project(u, stats, _members_with_ties(u, k, stats)),
      lambda u, stats: project(u, stats, u >= stats[1:2]),
      u, stats)


def sparse_semi_dual_adam(C: Array, a: Array, b: Array, k: int, gamma: float,
                          num_steps: int, learning_rate: float) -> Array:
  """Plans (G, m, n) of G sparsity-constrained semi-duals after `num_steps` Adam steps.

  Args:
    C: (G, m, n) costs; a: (G, m) row marginals; b: (G, n) column marginals
      (each plan column has mass b_j and at most k nonzeros).
    k: static int >= 1. gamma: > 0. num_steps: static int >= 0.
    learning_rate: Adam step size; alpha starts at 0, as in `ot.solve`.
  """
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
    t = (i + 1).astype(C.dtype)
    mu = _B1 * mu + (1 - _B1) * grad
    nu = _B2 * nu + (1 - _B2) * grad * grad
    alpha = alpha + learning_rate * (mu / (1 - _B1 ** t)) / (jnp.sqrt(nu / (1 - _B2 ** t)) + _EPS)
    return alpha, mu, nu, make_u(alpha)

  zeros = jnp.zeros((m, g), C.dtype)
  _, _, _, u = jax.lax.fori_loop(0, num_steps, step, (zeros, zeros, zeros, make_u(zeros)))
  plan = _sparse_projection(u.reshape(m, n * g), k, b_cols, lambda t: t)
  return jnp.transpose(plan.reshape(m, n, g), (2, 0, 1))
