"""`solve_interior_point`: sparsity-constrained OT to the exact optimum, kinks included.

The semi-dual of a binding k is concave but not smooth: where more rows want a
column than its k places allow, rows tie at the column's k-th value and the
objective has a kink there. L-BFGS (`solve`) converges sublinearly on such kinks
(100 x 100 with k = 2: 1e-4 short of the optimum after 1000 iterations). This
module solves the convex primal the (semi-)dual optimum belongs to instead,
P_Psi (Proposition 3, biconjugates), in the variational form of the squared
k-support norm:

    min_{T, L}  <T, C> + gamma/2 sum_ij T_ij^2 / L_ij
    s.t.  T 1 = a,  T^T 1 = b,  L^T 1 = k,  T > 0,  0 < L < 1,

(min over L of 1/2 sum_i t_i^2 / l_i with sum l = k, 0 <= l <= 1 is Psi(t)),
by a primal barrier method (Boyd & Vandenberghe, Convex Optimization, ch. 11):
Newton steps on f_mu = objective - mu sum(log T + log L + log(1 - L)) under the
linear constraints, mu shrunk 20-fold whenever Newton has converged for it.
Each entry (i, j) contributes a 2 x 2 block to the Hessian; the row constraints
are eliminated (their block is diagonal) and the Newton system reduces to a
dense (2n - 1) x (2n - 1) one, the Schur complement sum_i B_i B_i^T / d_i
over rows: O(m n^2) work per step on every entry (quick on a CPU up to m n^2
~1e7; docs/OT.md, "How `ot.solve` decides").

Where that is too much the barrier runs on a candidate support instead: the
variables live on a few entries per row (T = L = 0 elsewhere), chosen from
potentials near the optimum (`candidate_mask`: the rows nearest each column's
k-th value). A row's entries only pair with each other in the Schur
complement, so its cost falls to the number of same-row pairs plus the
(2n - 1)-square solve. The restricted problem's optimum is an upper bound on
the full one and the full semi-dual at its multipliers a lower bound; where
they disagree the support is grown by the candidates of the new multipliers
and solved again (`solve_on_candidates`, column generation). 10,000 x 100
with k = 100 from 200 L-BFGS iterations: ~31,000 of 1e6 entries, one round.

The Newton multipliers of the row constraints are the potentials alpha; the
result reports the semi-dual S(alpha) and its k-sparse plan as `solve` does, and
a duality gap between two bounds on the optimum: P_Psi of the barrier's plan T
rounded onto the marginals (the Newton solves drift off them by rounding),
minus S(alpha). That coupling is returned too (`primal_plan`), without the
barrier's mu-sized entries where dropping them costs nothing: at a kink the
k-sparse plan is not a coupling, and this is the one that attains the value.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
from jax import lax

from vmoe_sparse_ot.ot import objectives
from vmoe_sparse_ot.ot import optim
from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import results
from vmoe_sparse_ot.ot import validation
from vmoe_sparse_ot.ot.regularizers import SparsityConstrained
from vmoe_sparse_ot.ot.results import OTResult

Array = jax.Array

# mu is divided by this once Newton has converged for it. 20 with _CENTERED =
# 1e-3 took 25-35% fewer Newton steps than 5 with 1e-6 on the benchmark's
# kink-bound problems (100 x 100 k = 2: 143 -> 99; 5000 x 10 k = 5: 134 -> 93),
# to the same optimum (1e-9 relative).
_SHRINK = 20.0
# Newton has converged for mu when its decrement^2 / 2 (the barrier
# objective's predicted decrease) is below this fraction of mu ...
_CENTERED = 1e-3
# ... or after this many steps at one mu (a safeguard: with 30, 500 x 500
# shrank mu before Newton had centered and stopped 1e-5 short; it centers
# within ~60).
_MAX_STEPS_PER_MU = 100
# Status "converged" (the value certified) also needs P_Psi(rounded plan) -
# S(alpha) <= this * |S(alpha)|.
_GAP_RTOL = results.CERTIFIED_RTOL
# Fraction of the way to the boundary (T = 0, L = 0 or 1) a step may go.
_TO_BOUNDARY = 0.99
# Matrix-scaling sweeps for a candidate support's starting plan.
_START_SCALINGS = 50
# Centered mus whose multipliers are kept for scoring (the last ones: the
# best multipliers come near the end).
_KEPT = 8
# `primal_plan`: the barrier keeps every entry positive, those off the
# optimum's support at about mu / (their reduced cost), up to 3e-6 of
# min(a_i, b_j) (what the entry could hold) on the tests' problems, the
# support's down to 4e-4 (100 x 100, k = 2). `_sparse_coupling` drops the
# entries below these fractions of min(a_i, b_j), the largest first whose
# coupling is no worse in P_Psi than the barrier's plan made a coupling
# whole (`_feasible`), which it falls back to. Measured on 10 problems (4 x 3
# to 200 x 10): 1e-4 was taken on every one and bettered that bound by the
# whole duality gap (1e-10 to 1e-7 of the value); 1e-2 dropped support
# entries on two (P_Psi 4e-8 and 1.4e-6 higher).
_SPARSE = (1e-4, 1e-6, 1e-8)
# Matrix-scaling sweeps before `_sparse_coupling`'s exact correction: they
# shrink the dropped mass multiplicatively (entries stay positive) but alone
# converge slowly on such patterns (200 x 10: stuck at 3e-8 of the mass).
_COUPLING_SCALINGS = 5
# `_sparse_coupling`'s plan must meet the marginals to this (L1, relative to
# the mass: rounding).
_COUPLING_RTOL = 1e-12


class _Support(NamedTuple):
  """The entries the barrier's variables live on, row by row: slot (i, d) is
  entry (i, cols[i, d]) where valid[i, d]. The full support (cols[i] = 0..n-1,
  all valid) is the problem itself; a candidate support (`support_of`) holds
  a few entries per row, and lists the pairs of slots that share a row
  (pair_slots: indices into the flattened (m, D) slots; m D stands for a
  slot whose value is 0) with the n x n cell each pair's product lands in."""
  cols: Array         # (m, D) int32 column of each slot
  valid: Array        # (m, D) bool
  pair_slots: Array   # (2, N) int32 (candidate support; (2, 0) when full)
  pair_cells: Array   # (N,) int32 c_1 n + c_2 for the pair's columns c_1, c_2


class _State(NamedTuple):
  T: Array           # (m, D) plan on the support, > 0 (1 on invalid slots)
  L: Array           # (m, D) k-support weights, in (0, 1) (1/2 on invalid slots)
  mu: Array          # barrier weight
  alphas: Array      # (_KEPT, m) row potentials at the last _KEPT centered mus
  plans: Array       # (_KEPT, m, D) the barrier's plans there
  centered: Array    # centered mus so far
  steps: Array       # Newton steps so far
  at_mu: Array       # Newton steps at the current mu
  done: Array


def _barrier_value(T, L, Ce, gamma, mu, valid):
  # One log of the product (far above float64's underflow, 1e-308, here)
  # instead of three: the logs were most of the line search's time.
  terms = Ce * T + 0.5 * gamma * T * T / L - mu * jnp.log(T * L * (1 - L))
  return jnp.sum(jnp.where(valid, terms, 0))


def _column_sums(support: _Support, n: int, full: bool, *xs):
  """(n,) sums per column of each (m, D) entry array in xs (zero on invalid
  slots); one pass over the support for all of them."""
  if full:
    return tuple(jnp.sum(x, 0) for x in xs)
  stacked = jnp.stack([x.ravel() for x in xs], 1)
  sums = jax.ops.segment_sum(stacked, support.cols.ravel(), num_segments=n)
  return tuple(sums[:, i] for i in range(len(xs)))


def _schur_products(P, Q, support: _Support, n: int, full: bool):
  """(P^T P, P^T Q, Q^T Q), each (n, n), for (m, D) entry values P, Q read as
  (m, n) matrices with zeros off the support."""
  if full:
    return P.T @ P, P.T @ Q, Q.T @ Q
  # A row's entries pair with each other only: the listed pairs' products
  # summed into their cells (the dense products cost m n^2).
  zero = jnp.zeros((1,), P.dtype)
  P, Q = jnp.concatenate([P.ravel(), zero]), jnp.concatenate([Q.ravel(), zero])
  first, second = support.pair_slots
  products = jnp.stack([P[first] * P[second], P[first] * Q[second], Q[first] * Q[second]], 1)
  sums = jax.ops.segment_sum(products, support.pair_cells, num_segments=n * n)
  return tuple(sums[:, i].reshape(n, n) for i in range(3))


def _newton_step(T, L, a, b, k, Ce, gamma, mu, support: _Support, n: int, full: bool):
  """(dT, dL, decrement^2, alpha): the equality-constrained Newton step of f_mu.

  KKT: H d + A^T nu = -g, A d = r (r: the constraints' residual, so rounding
  drift is corrected as it appears). H is block diagonal with one 2 x 2 block
  per entry; A sums T over rows (m), T over the first n - 1 columns (the last
  column's sum follows from the others when the masses agree) and L over
  columns (n). Eliminating the row multipliers leaves a (2n - 1)-square system.
  """
  valid = support.valid
  # Four reciprocals per entry, then products only: divisions dominated the
  # step's elementwise work (measured 1.1 -> 0.6 ms at 5000 x 10, one core).
  inv_L, inv_T, inv_S = 1 / L, 1 / T, 1 / (1 - L)
  R = T * inv_L
  gT = jnp.where(valid, Ce + gamma * R - mu * inv_T, 0)
  gL = jnp.where(valid, -0.5 * gamma * R * R - mu * inv_L + mu * inv_S, 0)
  hTT = gamma * inv_L + mu * inv_T * inv_T
  hTL = -gamma * R * inv_L
  hLL = gamma * R * R * inv_L + mu * inv_L * inv_L + mu * inv_S * inv_S
  inv_det = jnp.where(valid, 1 / (hTT * hLL - hTL * hTL), 0)
  iTT, iTL, iLL = hLL * inv_det, -hTL * inv_det, hTT * inv_det
  # H^-1 g, and the right-hand side A H^-1 g + r of the multipliers' system.
  uT = iTT * gT + iTL * gL
  uL = iTL * gT + iLL * gL
  T_in, L_in = jnp.where(valid, T, 0), jnp.where(valid, L, 0)

  col_uT, col_T, col_uL, col_L, s_tt, s_tl, s_ll = _column_sums(
      support, n, full, uT, T_in, uL, L_in, iTT, iTL, iLL)
  rhs_r = -jnp.sum(uT, 1) - (a - jnp.sum(T_in, 1))
  rhs_c = jnp.concatenate([(-col_uT - (b - col_T))[:n - 1], -col_uL - (k - col_L)])
  d_rows = jnp.sum(iTT, 1)                                   # (m,)
  # The Schur complement diag(column sums) - B^T diag(1 / d_rows) B, B (m, 2n)
  # = [iTT, iTL] as (m, n) matrices; T's last column is dropped at the end.
  scale = jax.lax.rsqrt(d_rows)[:, None]
  tt, tl, ll = _schur_products(iTT * scale, iTL * scale, support, n, full)
  schur = jnp.block([[jnp.diag(s_tt) - tt, jnp.diag(s_tl) - tl],
                     [jnp.diag(s_tl) - tl.T, jnp.diag(s_ll) - ll]])
  keep = jnp.concatenate([jnp.arange(n - 1), jnp.arange(n, 2 * n)])
  schur = schur[keep][:, keep]
  v = rhs_r / d_rows
  Bt_v = _column_sums(support, n, full, iTT * v[:, None], iTL * v[:, None])
  nu_c = jnp.linalg.solve(schur, rhs_c - jnp.concatenate([Bt_v[0][:n - 1], Bt_v[1]]))
  nu_t = jnp.concatenate([nu_c[:n - 1], jnp.zeros((1,), nu_c.dtype)])[support.cols]
  nu_l = nu_c[n - 1:][support.cols]
  nu_r = (rhs_r - jnp.sum(iTT * nu_t + iTL * nu_l, 1)) / d_rows
  nu_T = nu_r[:, None] + nu_t
  dT = -(iTT * (gT + nu_T) + iTL * (gL + nu_l))
  dL = -(iTL * (gT + nu_T) + iLL * (gL + nu_l))
  decrement2 = -jnp.sum(gT * dT + gL * dL)
  # Stationarity: C_ij + dPsi/dT_ij - mu / T_ij = -(nu_r_i + nu_t_j), so the
  # row potentials are -nu_r (up to the shift the semi-dual ignores).
  return dT, dL, decrement2, -nu_r


def _max_step(x, d, upper):
  """Largest t <= 1 with x + t d inside (0, upper), times _TO_BOUNDARY."""
  t_low = jnp.where(d < 0, x / jnp.where(d < 0, -d, 1), jnp.inf)
  t_up = jnp.where(d > 0, (upper - x) / jnp.where(d > 0, d, 1), jnp.inf)
  return jnp.minimum(1.0, _TO_BOUNDARY * jnp.min(jnp.minimum(t_low, t_up)))


def _feasible(T, a, b):
  """(m, n) a coupling of a and b near T >= 0: rows and columns scaled down to
  at most their marginal, then the mass still missing added as a rank-one
  plan. Moves T by about its marginal residual."""
  tiny = jnp.finfo(T.dtype).tiny
  T = jnp.maximum(T, 0)
  T = T * jnp.minimum(1, a / jnp.maximum(jnp.sum(T, 1), tiny))[:, None]
  T = T * jnp.minimum(1, b / jnp.maximum(jnp.sum(T, 0), tiny))[None, :]
  missing_r, missing_c = a - jnp.sum(T, 1), b - jnp.sum(T, 0)
  return T + jnp.outer(missing_r, missing_c) / jnp.maximum(jnp.sum(missing_r), tiny)


@functools.partial(jax.jit, static_argnames=("k", "full"))
def _sparse_coupling(plan, a, b, C, gamma, support: _Support, threshold, *, k: int,
                     full: bool):
  """(Y, ok, P_Psi(Y)): Y (m, n) a coupling of a and b (b matched to a's
  mass) from the barrier's (m, D) plan on `support` without its entries at
  most threshold * min(a_i, b_j) (the barrier's mu-sized ones, see `_SPARSE`).

  The kept pattern M is scaled onto the marginals for a few sweeps, then
  corrected exactly on it: the least-squares change D_ij = u_i + v_j (on kept
  entries) that closes the marginals' residuals r (rows), c (columns):
  deg_i u_i + (M v)_i = r_i, (M^T u)_j + cdeg_j v_j = c_j; u eliminated, an
  n-square system (singular: one null direction per connected group of rows
  and columns, u + t, v - t; least squares) whose product M^T diag(1 / deg) M
  is summed over the support's same-row pairs as in a Newton step. ok: Y
  meets the marginals to rounding with no negative entry (False where a row
  or column was emptied, or the pattern holds no coupling)."""
  n = C.shape[1]
  tiny = jnp.finfo(plan.dtype).tiny
  cols = support.cols
  b_slot = b[cols]
  kept = jnp.where(support.valid & (plan > threshold * jnp.minimum(a[:, None], b_slot)),
                   plan, 0)

  def column_sums(x):
    return _column_sums(support, n, full, x)[0]

  def scale(_, X):
    X = X * (a / jnp.maximum(jnp.sum(X, 1), tiny))[:, None]
    return X * (b / jnp.maximum(column_sums(X), tiny))[cols]
  X = lax.fori_loop(0, _COUPLING_SCALINGS, scale, kept)
  M = (X > 0).astype(plan.dtype)
  deg, cdeg = jnp.sum(M, 1), column_sums(M)
  inv_deg = 1 / jnp.maximum(deg, 1)
  r, c = a - jnp.sum(X, 1), b - column_sums(X)
  scaled = M * jnp.sqrt(inv_deg)[:, None]
  schur = jnp.diag(cdeg) - _schur_products(scaled, scaled, support, n, full)[0]
  v = jnp.linalg.lstsq(schur, c - column_sums(M * (r * inv_deg)[:, None]))[0]
  u = (r - jnp.sum(M * v[cols], 1)) * inv_deg
  Y = _dense(X + M * (u[:, None] + v[cols]), support, n)
  error = jnp.sum(jnp.abs(jnp.sum(Y, 1) - a)) + jnp.sum(jnp.abs(jnp.sum(Y, 0) - b))
  ok = (jnp.all(deg > 0) & jnp.all(cdeg > 0) & jnp.all(Y >= 0)
        & (error <= _COUPLING_RTOL * jnp.sum(a)))   # False for NaN too
  return Y, ok, objectives.primal_objective(Y, C, SparsityConstrained(k, gamma))


def _dense(x, support: _Support, n: int):
  """(m, n) the entry values x (m, D) in place, zeros off the support."""
  m = x.shape[0]
  rows = jnp.broadcast_to(jnp.arange(m)[:, None], x.shape)
  return jnp.zeros((m, n), x.dtype).at[rows, support.cols].add(jnp.where(support.valid, x, 0))


def _start(a, b, k, support: _Support, n: int, full: bool):
  """(T0, L0): a strictly positive plan on the support near the marginals and
  weights k / (entries in the column). Full support: the independent coupling.
  Otherwise matrix scaling of the support's pattern (the Newton steps absorb
  what is left of the marginals' residual)."""
  valid = support.valid
  mass = jnp.sum(a)
  if full:
    T0 = jnp.outer(a, b) / mass
  else:
    def scale(_, T):
      T = T * (a / jnp.sum(T, 1))[:, None]
      return T * (b / _column_sums(support, n, full, T)[0])[support.cols]
    T0 = lax.fori_loop(0, _START_SCALINGS, scale, jnp.where(valid, b[support.cols], 0))
    T0 = T0 * (a / jnp.sum(T0, 1))[:, None]
  per_column = _column_sums(support, n, full, valid.astype(a.dtype))[0]
  L0 = (k / per_column)[support.cols]
  return jnp.where(valid, T0, 1), jnp.where(valid, L0, 0.5)


@functools.partial(jax.jit, static_argnames=("k", "max_newton", "rtol", "full"))
def _barrier(a, b, C, gamma, support: _Support, *, k, max_newton, rtol, full):
  """The barrier method's loop: (the last _KEPT centered mus' multipliers
  (_KEPT, m) and plans (_KEPT, m, D), a ring written at slot c % _KEPT by
  the c-th centered mu; how many mus were centered, the last plan, Newton
  steps, whether its stop rule fired, whether the last step centered its mu)."""
  m, n = C.shape
  dtype = C.dtype
  valid = support.valid
  mass = jnp.sum(a)
  b = results.matched_mass(b, a)
  Ce = jnp.take_along_axis(C, support.cols, axis=1)
  T0, L0 = _start(a, b, k, support, n, full)
  entries = jnp.sum(valid)
  scale = jnp.max(jnp.abs(C)) + gamma * jnp.max(b)
  mu0 = scale * mass / entries
  count = 3 * entries   # inequalities: the barrier's suboptimality is count * mu

  def cond(s: _State):
    return ~s.done & (s.steps < max_newton)

  def body(s: _State):
    dT, dL, dec2, alpha = _newton_step(s.T, s.L, a, b, k, Ce, gamma, s.mu, support, n, full)
    t_max = jnp.minimum(_max_step(s.T, dT, jnp.inf), _max_step(s.L, dL, 1.0))
    f0 = _barrier_value(s.T, s.L, Ce, gamma, s.mu, valid)

    def ls_cond(t):
      return (_barrier_value(s.T + t * dT, s.L + t * dL, Ce, gamma, s.mu, valid)
              > f0 - 0.25 * t * dec2) & (t > 1e-10)
    t = lax.while_loop(ls_cond, lambda t: 0.5 * t, t_max)
    T, L = s.T + t * dT, s.L + t * dL
    centered = (0.5 * dec2 <= _CENTERED * s.mu) | (s.at_mu + 1 >= _MAX_STEPS_PER_MU)
    primal = jnp.sum(jnp.where(valid, Ce * T + 0.5 * gamma * T * T / L, 0))
    done = centered & (count * s.mu <= rtol * jnp.abs(primal))
    mu = jnp.where(centered, s.mu / _SHRINK, s.mu)
    # The multipliers are kept once per mu (when centered) and scored after
    # the loop: at the smallest mu the Newton system is ill-conditioned and
    # the last multipliers need not be the best.
    slot = s.centered % _KEPT
    alphas = s.alphas.at[slot].set(jnp.where(centered, alpha, s.alphas[slot]))
    plans = s.plans.at[slot].set(jnp.where(centered, T, s.plans[slot]))
    return _State(T, L, mu, alphas, plans, s.centered + centered, s.steps + 1,
                  jnp.where(centered, 0, s.at_mu + 1), done)

  init = _State(T0, L0, mu0.astype(dtype), jnp.zeros((_KEPT, m), dtype),
                jnp.broadcast_to(T0, (_KEPT,) + T0.shape), jnp.asarray(0, jnp.int32),
                jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32), jnp.asarray(False))
  s = lax.while_loop(cond, body, init)
  # at_mu == 0: the last step centered its mu, so s.T is the newest kept plan.
  return s.alphas, s.plans, s.centered, s.T, s.steps, s.done, s.at_mu == 0


@functools.partial(jax.jit, static_argnames=("k",))
def _upper_bound(plan, a, b, C, gamma, support: _Support, *, k: int):
  """An upper bound on the optimum: P_Psi at the (m, D) plan made a coupling
  of a and b (`_feasible`: at the smallest mu the Newton solves drift off the
  marginals, a 100 x 100 plan to 5e-7 below the optimum without it)."""
  b = results.matched_mass(b, a)
  coupling = _feasible(_dense(plan, support, C.shape[1]), a, b)
  return objectives.primal_objective(coupling, C, SparsityConstrained(k, gamma))


def _best_upper_bound(plans, centered: int, T_last, last_kept: bool, bound):
  """(value, plan): the smallest `bound(plan)` over the barrier's last plans
  (and that plan), newest first,
  until one is worse than the best so far by more than 1e-9 relative (near
  ties go on: where Newton steps stall, consecutive mus keep nearly the same
  plan; 300 x 20 stopped at a 1-ulp rise and reported a 2.3e-6 gap, 7.5e-8
  two mus back). Every plan bounds the optimum once made a coupling; going
  back in mu the barrier's own gap (3 entries mu) grows, going forward the
  drift off the marginals does (60 x 40: 7e-10 at one mu, 8e-8 two mus
  later), so the bounds fall then rise and 2-5 evaluations find the best
  (each sorts the columns for P_Psi). Non-finite
  bounds are skipped; (inf, None) if none is finite."""
  # last_kept: the last step centered its mu and T_last is the newest kept plan.
  newest = [] if last_kept else [T_last]
  newest += [plans[(centered - 1 - i) % _KEPT] for i in range(min(centered, _KEPT))]
  best, best_plan = np.inf, None
  for plan in newest:
    value = float(bound(plan))
    if not np.isfinite(value):
      continue
    if value > best + 1e-9 * abs(best):
      break
    if value < best:
      best, best_plan = value, plan
  return best, best_plan


def _sparsest_coupling(plan, a, b, C, gamma, support: _Support, full: bool, k: int,
                       bound: float):
  """(coupling, P_Psi of it) from the barrier's (m, D) plan whose coupling
  `_feasible` has P_Psi = bound: the first of `_SPARSE`'s sparse couplings
  within bound, else that one itself (every entry positive)."""
  b = results.matched_mass(b, a)
  for threshold in _SPARSE:
    Y, ok, value = _sparse_coupling(plan, a, b, C, gamma, support, threshold, k=k, full=full)
    # Rounding allowance: where it drops only mu-sized entries the sparse
    # coupling is lower by about the gap (1e-10 to 1e-7 of the value).
    if bool(ok) and float(value) <= bound + 1e-12 * abs(bound):
      return Y, float(value)
  return _feasible(_dense(plan, support, C.shape[1]), a, b), bound


def _bucket(size: int) -> int:
  """size rounded up to a power of two: problems of one shape share compiled code."""
  return 1 << max(0, int(size) - 1).bit_length()


def support_of(mask) -> _Support:
  """The `_Support` of the True entries of an (m, n) boolean mask with at least
  one per row. Eager numpy; slots per row and pairs padded to powers of two."""
  mask = np.asarray(mask, bool)
  m, n = mask.shape
  degree = mask.sum(1)
  width = min(n, _bucket(degree.max()))
  # Each row's columns first, in order (a stable sort of ~mask).
  cols = np.argsort(~mask, axis=1, kind="stable")[:, :width].astype(np.int32)
  valid = np.arange(width)[None, :] < degree[:, None]
  cols = np.where(valid, cols, 0)
  # Pairs (d1, d2) of valid slots of each row, d1 and d2 < degree: sum of
  # degree^2 of them, listed without an (m, width, width) array (one row in
  # every column would make that m n^2).
  per_row = degree * degree
  rows = np.repeat(np.arange(m), per_row)
  within = np.arange(per_row.sum()) - np.repeat(np.cumsum(per_row) - per_row, per_row)
  d1, d2 = within // degree[rows], within % degree[rows]
  first, second = rows * width + d1, rows * width + d2
  cells = cols.ravel()[first] * n + cols.ravel()[second]
  pad = _bucket(first.size) - first.size
  slots = np.stack([np.pad(first, (0, pad), constant_values=m * width),
                    np.pad(second, (0, pad), constant_values=m * width)]).astype(np.int32)
  return _Support(jnp.asarray(cols), jnp.asarray(valid), jnp.asarray(slots),
                  jnp.asarray(np.pad(cells, (0, pad)).astype(np.int32)))


def candidate_mask(alpha, C, k: int, *, band: float = 20.0, per_row: int = 2):
  """(m, n) bool: entries likely in the optimal plan's support, from row
  potentials alpha near the optimum: in each column the k + min(2 k, band
  sqrt(k)) rows (3 k up to k = 100; 1.26 k at k = 5750) with the largest
  alpha_i - C_ij, and in each row the per_row columns where alpha_i - C_ij is
  closest to (or above) the column's k-th largest value. Eager numpy.

  The band: 50,000 x 10 with k = 5750 needed one round from L-BFGS's
  potentials with 1.1 k or 1.3 k rows per column (3 k, 180,000 candidates,
  took three times as long), 10,000 x 100 with k = 100 one with 3 k."""
  Z = np.asarray(alpha)[:, None] - np.asarray(C)
  m, n = Z.shape
  top = min(m, k + max(1, int(np.ceil(min(2 * k, band * np.sqrt(k))))))
  ordered = -np.sort(-Z, axis=0)  # each column descending
  mask = Z >= ordered[top - 1][None, :]
  closeness = Z - ordered[k - 1][None, :]
  per_row = min(per_row, n)
  best = np.argpartition(-closeness, per_row - 1, axis=1)[:, :per_row]
  np.put_along_axis(mask, best, True, axis=1)
  # Rows and columns linked through the mask's entries must form one group,
  # else the barrier's constraints lose rank (one per extra group) and its
  # Newton system is singular. One whole column links every row.
  graph = scipy.sparse.csr_matrix(mask)
  if scipy.sparse.csgraph.connected_components(
      scipy.sparse.bmat([[None, graph], [graph.T, None]]), directed=False)[0] > 1:
    mask[:, int(np.argmax(np.max(Z, axis=0) - ordered[k - 1]))] = True
  return mask


def solve_interior_point(a, b, C, regularizer: SparsityConstrained, *,
                         max_newton: int = 500, rtol: float = 1e-10, init=None,
                         infeasible: str = "warn"):
  """Sparsity-constrained OT to its exact optimum by a barrier method on P_Psi.

  For the problems L-BFGS ends on a kink (k binds; the marginals of its plan
  still off): 100 x 100 with k = 2 reaches the optimum to ~1e-9 relative in
  ~100 Newton steps, where L-BFGS stops 5e-5 short. `solve`'s defaults call
  it themselves (see its "Kinks"). On every entry O(m n^2) work per step;
  with `init`, on a candidate support (see the module docstring). float64
  (enable x64).

  Args:
    a: (m,) positive row marginal; b: (n,) positive column marginal, same mass.
    C: (m, n) finite real cost.
    regularizer: `SparsityConstrained(k, gamma)` with k < m (for k >= m use
      `solve`: the problem is smooth).
    max_newton: Python int >= 1, Newton step budget (per round on a
      candidate support).
    rtol: Python float > 0: stop once the barrier's bound on the primal's
      suboptimality, 3 mu per entry it runs on (3 m n mu on every entry), is
      below rtol |P| (and Newton has converged).
    init: None (every entry), or potentials near the optimum -- alpha (m,) or
      an `OTResult`, e.g. from a short `solve` -- to run on the candidate
      support grown from them (`solve_on_candidates`): for large m n^2.
      num_iter then counts the Newton steps of every round.
    infeasible: "warn", "raise" or "ignore" where n k < m (no k-sparse
      coupling exists), as in `solve`.

  Returns:
    `OTResult` as from `solve`: alpha = the Newton multipliers of the row
    constraints, value = the semi-dual S(alpha), plan = its k-sparse plan,
    beta = dS/db; num_iter = num_evals = Newton steps. duality_gap =
    P_Psi(primal_plan) - S(alpha) (>= 0 up to rounding): primal_plan is a
    coupling, a barrier plan (the best of the last few mus') without its
    mu-sized entries and put back onto the marginals, or, where dropping them
    would raise P_Psi, that plan rounded onto the marginals whole. The
    optimum lies within the gap (measured at most 1e-9 relative on 10 of the
    tests' problems, most below 1e-11; 1e-11 to 1e-7 before the entries were
    dropped).
    primal_nnz_per_column: primal_plan's nonzeros per column (more than k in
    a column where the optimum ties rows at that column's k-th value). status
    "converged" (the barrier's rule fired and duality_gap <= 1e-6 |value|),
    "stalled" (the rule fired, the gap is wider) or "max_iter": about the
    value. grad_norm is the largest marginal violation of the k-sparse plan
    at alpha (not zero on a kink), row_error / col_error / plan_feasible the
    L1 errors of `plan`. Where that plan misses the marginals but
    primal_plan has at most k nonzeros per column and the value is
    certified, primal_plan is the sparsity-constrained optimum and is
    returned as `plan` too. converged: status "converged" and `plan` a
    coupling (plan_feasible); False at a kink whose optimum has no k-sparse
    coupling, however well the value is certified (`reason(full=True)`).

  Raises:
    ValueError naming the argument: as `solve`, and for zero entries of a or
    b (the barrier needs an interior), k >= m, or another regularizer.
  """
  if not isinstance(regularizer, SparsityConstrained):
    raise ValueError("regularizer must be SparsityConstrained(k, gamma) for "
                     f"solve_interior_point, got {type(regularizer).__name__}")
  max_newton = validation.check_int("max_newton", max_newton, 1)
  rtol = validation.check_pos_float("rtol", rtol)
  validation.check_problem(a, b, C)
  regularizer.validate()
  a, b, C, regularizer, init = validation.not_differentiable(
      "ot.solve_interior_point cannot be differentiated (its Newton steps run "
      "eagerly and stop on data-dependent tests): ot.semi_dual_loss gives the gradient "
      "of the optimal value, or stop_gradient its inputs", (a, b, C, regularizer, init))
  results.check_k_sparse_feasible(a, C, regularizer, infeasible)
  C = jnp.asarray(C)
  m, n = C.shape
  if regularizer.k >= m:
    raise ValueError(f"regularizer.k must be < m = {m} for solve_interior_point (k = "
                     f"{regularizer.k} leaves the problem smooth: use solve), got {regularizer.k}")
  if n < 2:
    raise ValueError(f"C must have at least 2 columns for solve_interior_point, got {n}")
  for name, x in (("a", a), ("b", b)):
    if validation.is_concrete(x) and not bool(jnp.all(jnp.asarray(x) > 0)):
      raise ValueError(f"{name} must be positive everywhere for solve_interior_point "
                       "(drop zero-mass rows or columns first)")
  if init is None:
    return solve_positive(a, b, C, regularizer, max_newton=max_newton, rtol=float(rtol))
  alpha = jnp.asarray(getattr(init, "alpha", init))
  if alpha.shape != (m,):
    raise ValueError(f"init alpha must have shape ({m},), got {alpha.shape}")
  return solve_on_candidates(a, b, C, regularizer, alpha, max_newton=max_newton,
                             rtol=float(rtol))


def _settle(res: OTResult, a, b, k: int) -> OTResult:
  """res with `converged` = certified (status "converged") and `plan` a
  coupling (plan_feasible), and with primal_plan as the plan where that is
  the solution: where the optimum is a kink the k-sparse plan at the
  multipliers misses the marginals, but a primal_plan with at most k
  nonzeros per column is a k-sparse coupling attaining the certified value
  (its Psi is 1/2 ||t||^2, so its cost is the sparsity-constrained one and
  the relaxation's optimum bounds that from below). C 1e30 times [0, 1) with
  gamma 0.1: the plan at the multipliers was zero (u = (alpha - c) / gamma
  spans 1e31, and the threshold cancels the mass away), primal_plan exact."""
  certified = int(res.status) == optim.CONVERGED
  if (certified and not bool(res.plan_feasible) and res.primal_plan is not None
      and int(np.max(np.asarray(res.primal_nnz_per_column))) <= k):
    row, col, feasible = results.host_plan_errors(res.primal_plan, a, b)
    res = res._replace(plan=res.primal_plan, row_error=row, col_error=col,
                       plan_feasible=feasible)
  return res._replace(converged=jnp.asarray(certified and bool(res.plan_feasible)))


def solve_positive(a, b, C, reg: SparsityConstrained, *, max_newton: int = 500,
                   rtol: float = 1e-10, support: _Support | None = None,
                   settle: bool = True) -> OTResult:
  """`solve_interior_point` without the argument checks (a, b > 0, k < m, n >= 2);
  on `support` (from `support_of`) when given, else on every entry. Eager.
  settle=False (the rounds of `solve_on_candidates`): the plan at the
  multipliers and converged = certified, before `_settle`.
  A support needs a plan on it meeting the marginals with more than k entries
  per column, and rows and columns linked into one group by its entries
  (`candidate_mask` sees to the last); else the barrier cannot finish and
  its bounds stay apart."""
  dtype = precision.compute_dtype(a, b, C)    # half precision: float32
  a, b, C = (jnp.asarray(x, dtype) for x in (a, b, C))
  gamma = jnp.asarray(reg.gamma, dtype)
  m, n = C.shape
  full = support is None
  if full:
    support = _Support(jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (m, n)),
                       jnp.ones((m, n), bool), jnp.zeros((2, 0), jnp.int32),
                       jnp.zeros((0,), jnp.int32))
  alphas, plans, centered, T_last, steps, done, last_kept = _barrier(
      a, b, C, gamma, support, k=reg.k, max_newton=max_newton, rtol=rtol, full=full)
  # The kept multipliers scored by the semi-dual, with the function `solve`
  # compiles for its own result (so that it is compiled once).
  # (Slot 0 holds alpha = 0 before any mu is centered: a valid lower bound.)
  kept = max(1, min(int(centered), _KEPT))
  # Read on the host (eager indexing and arithmetic would each compile).
  alphas, plans = np.asarray(alphas), np.asarray(plans)
  scored = [results.semi_dual_at(alphas[i], a, b, C, reg) for i in range(kept)]
  best = max(range(len(scored)), key=lambda i: float(scored[i][0]))
  value, plan, beta, _ = scored[best]
  primal, bound_plan = _best_upper_bound(
      plans, int(centered), T_last, bool(last_kept),
      lambda plan: _upper_bound(plan, a, b, C, gamma, support, k=reg.k))
  # primal_plan: the bound's coupling without the barrier's mu-sized entries,
  # where that is no worse (its P_Psi then the upper bound).
  coupling = None
  if bound_plan is not None:
    coupling, primal = _sparsest_coupling(bound_plan, a, b, C, gamma, support, full, reg.k,
                                          primal)
  # Converged: the barrier's rule fired and its two bounds agree (off-path
  # iterates could satisfy the first alone).
  gap = float(primal) - float(value)
  converged = bool(done) and gap <= _GAP_RTOL * abs(float(value))
  status = optim.CONVERGED if converged else optim.STALLED if bool(done) else optim.MAX_ITER
  grad_norm = np.max(np.abs(np.asarray(a) - np.asarray(plan).sum(1)))
  row, col, feasible = results.host_plan_errors(plan, a, b)
  nnz = None if coupling is None else jnp.asarray(
      np.count_nonzero(np.asarray(coupling), axis=0), jnp.int32)
  res = OTResult(plan=plan, value=value, alpha=jnp.asarray(alphas[best]), beta=beta,
                 num_iter=steps, grad_norm=jnp.asarray(grad_norm, dtype),
                 converged=jnp.asarray(converged), duality_gap=jnp.asarray(gap, dtype),
                 num_evals=steps, trace=None, status=jnp.asarray(status, jnp.int32),
                 row_error=row, col_error=col, plan_feasible=feasible,
                 primal_plan=coupling, primal_nnz_per_column=nnz)
  return _settle(res, a, b, reg.k) if settle else res


def solve_on_candidates(a, b, C, reg: SparsityConstrained, alpha, *, max_rounds: int = 4,
                        max_newton: int = 500, rtol: float = 1e-10) -> OTResult:
  """The barrier method on a candidate support grown from potentials alpha
  near the optimum (column generation), for problems too large for the dense
  Newton system (its cost per step: O(m D + pairs + n^3) instead of m n^2).

  Round 1 solves on `candidate_mask(alpha)`; each later round adds the
  candidates of the previous round's multipliers, until the two bounds agree
  (status "converged": the full problem's semi-dual at the multipliers, and
  P_Psi of the support's plan, a coupling of the full problem), the support
  stops growing, or max_rounds (>= 1). A support missing entries of the
  optimal plan still gives valid bounds, only apart. Returns the round with
  the highest semi-dual value, with the smallest upper bound of all rounds
  (duality_gap; "converged" when some round's barrier finished and the two
  agree to 1e-6), num_iter and num_evals summed over the rounds. Arguments
  as `solve_positive` (no checks), alpha (m,).
  """
  mask = candidate_mask(alpha, C, reg.k)
  best, upper, primal, finished, steps = None, np.inf, None, False, 0
  for _ in range(max(1, max_rounds)):
    res = solve_positive(a, b, C, reg, max_newton=max_newton, rtol=rtol,
                         support=support_of(mask), settle=False)
    steps += int(res.num_iter)
    finished |= int(res.status) != optim.MAX_ITER
    if best is None or float(res.value) > float(best.value):
      best = res
    if float(res.value) + float(res.duality_gap) < upper:
      # The coupling of the smallest upper bound, whichever round's.
      upper, primal = float(res.value) + float(res.duality_gap), res
    agree = upper - float(best.value) <= _GAP_RTOL * abs(float(best.value))
    if finished and agree:
      break
    grown = mask | candidate_mask(res.alpha, C, reg.k)
    if grown.sum() == mask.sum():
      break
    mask = grown
  converged = finished and agree
  status = optim.CONVERGED if converged else optim.STALLED if finished else optim.MAX_ITER
  dtype = best.value.dtype
  res = best._replace(num_iter=jnp.asarray(steps, jnp.int32),
                      num_evals=jnp.asarray(steps, jnp.int32),
                      duality_gap=jnp.asarray(upper - float(best.value), dtype),
                      converged=jnp.asarray(converged),
                      status=jnp.asarray(status, jnp.int32),
                      primal_plan=None if primal is None else primal.primal_plan,
                      primal_nnz_per_column=None if primal is None
                      else primal.primal_nnz_per_column)
  return _settle(res, a, b, reg.k)

