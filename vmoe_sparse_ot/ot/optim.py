"""Small jit/vmap-friendly maximisers for the dual and semi-dual (no optax state).

Both work on a flat parameter vector x and a function `value_and_grad(x) ->
(value, grad, aux)` to be MAXIMISED. They are written as `lax.while_loop`s so they
compile once, run under `vmap` (a batch stops when all its members have), and,
with tol == 0, run exactly `max_iter` iterations (Adam as a `fori_loop`).

L-BFGS: the compact (matrix) form of the inverse-Hessian approximation on the
last `history` pairs, kept in a ring buffer (updated in place: no copy of the
history per iteration), with a backtracking
Armijo line search that tries the unit step first -- one objective evaluation per
iteration in the common case. The objectives here are concave, so y^T s >= 0 always holds and
Armijo alone keeps the curvature pairs valid. Where the value change is within
rounding of the value (float32 near the optimum), Armijo's test is read on
slopes instead (approximate Wolfe conditions, Hager & Zhang 2005).
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


class OTTrace(NamedTuple):
  """Per-iteration record of a solve, for convergence plots (each (max_iter,)).

  value[i]: the objective being maximised (dual or semi-dual) after iteration i.
  grad_norm[i]: max |gradient| there (the largest marginal violation).
  num_evals[i]: objective evaluations so far (the initial one and line-search
    trials included).
  Entries after the last iteration run are NaN (value, grad_norm) and repeat the
  final count (num_evals).
  """
  value: Array
  grad_norm: Array
  num_evals: Array


# Why a solver stopped (OptState.status, OTResult.status); names in STATUS.
CONVERGED = 0       # max |grad| <= tol: the marginals hold to tol
OBJECTIVE_TOL = 1   # L-BFGS: the objective stopped improving (rtol / ftol rules)
MAX_ITER = 2        # the iteration budget ran out first
STALLED = 3         # L-BFGS: the line search found no increase (rounding level,
                    # or a kink it cannot cross); solve_interior_point: its stop
                    # rule fired but its two bounds are wider apart than 1e-6
FIXED_ITER = 4      # tol == 0: ran exactly max_iter iterations, as asked
INTERIOR_POINT = 5  # `solve`: L-BFGS ended on a kink; the interior point finished
STATUS = ("converged", "objective_tol", "max_iter", "stalled", "fixed_iter", "interior_point")


class OptState(NamedTuple):
  x: Array
  value: Array
  grad: Array
  num_iter: Array
  num_evals: Array
  grad_norm: Array
  trace: Optional[OTTrace] = None
  status: Array = None


def _empty_trace(max_iter: int, dtype) -> OTTrace:
  nan = jnp.full((max_iter,), jnp.nan, dtype)
  return OTTrace(nan, nan, jnp.zeros((max_iter,), jnp.int32))


def _record(tr: Optional[OTTrace], i, value, grad, evals) -> Optional[OTTrace]:
  """Writes iteration i's entry (a no-op when tracing is off)."""
  if tr is None:
    return None
  return OTTrace(tr.value.at[i].set(value.astype(tr.value.dtype)),
                 tr.grad_norm.at[i].set(_gnorm(grad).astype(tr.value.dtype)),
                 tr.num_evals.at[i].set(evals))


def _finish_trace(tr: Optional[OTTrace], num_iter, num_evals) -> Optional[OTTrace]:
  """Repeats the final evaluation count after the last iteration."""
  if tr is None:
    return None
  filled = jnp.arange(tr.num_evals.shape[0]) < num_iter
  return tr._replace(num_evals=jnp.where(filled, tr.num_evals, num_evals))


def _gnorm(g):
  return jnp.max(jnp.abs(g))


# Value changes within this many ulps of |value| count as rounding noise.
_F_NOISE = 100.0
# ...and a step accepted on slopes alone must have flattened the slope by this
# factor at least (Wolfe's curvature condition): tiny steps, which always pass
# the slope form of Armijo, make no measurable progress.
_SIGMA = 0.9

ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8


def adam_update(i, x, m, v, g, learning_rate, b1=ADAM_B1, b2=ADAM_B2, eps=ADAM_EPS):
  """One Adam ascent step (iteration i from 0) on arrays of any shape: (x, m, v)."""
  t = (i + 1).astype(x.dtype)
  m = b1 * m + (1 - b1) * g
  v = b2 * v + (1 - b2) * g * g
  x = x + learning_rate * (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps)
  return x, m, v


def adam(fun: Callable, x0: Array, *, max_iter, tol, learning_rate,
         b1: float = ADAM_B1, b2: float = ADAM_B2, eps: float = ADAM_EPS,
         trace: bool = False, tol_scale=1.0, fixed_iter: Optional[bool] = None) -> OptState:
  """Adam ascent. Stops when max|grad| <= tol * tol_scale (checked only if tol > 0).

  max_iter, tol and learning_rate may be traced scalars (one compiled program
  for every value); then `fixed_iter` (Python bool: tol == 0, a fixed-length
  loop) must be given, and with trace=True max_iter must stay a Python int
  (the trace's length).
  trace=True also returns an `OTTrace` of the iterates (one more carried buffer
  per recorded quantity; nothing when off)."""
  dtype = x0.dtype
  if fixed_iter is None:
    fixed_iter = tol == 0

  def step(i, x, m, v, g):
    return adam_update(i, x, m, v, g, learning_rate, b1, b2, eps)

  zeros = jnp.zeros_like(x0)
  tr0 = _empty_trace(max_iter, dtype) if trace else None
  if fixed_iter:
    # Iteration i evaluates at x_i (before its step), so the entry it records is
    # iteration i - 1's result; the final evaluation records the last one.
    def body(i, carry):
      x, m, v, tr = carry
      value, g, _ = fun(x)
      if trace:
        tr = _record(tr, jnp.maximum(i - 1, 0), value, g, i + 1)
        tr = jax.tree_util.tree_map(lambda new, old: jnp.where(i > 0, new, old), tr, carry[3])
      x, m, v = step(i, x, m, v, g)
      return x, m, v, tr
    x, _, _, tr = lax.fori_loop(0, max_iter, body, (x0, zeros, zeros, tr0))
    value, g, _ = fun(x)
    tr = _record(tr, max_iter - 1, value, g, max_iter + 1)
    return OptState(x, value, g, jnp.asarray(max_iter, jnp.int32),
                    jnp.asarray(max_iter + 1, jnp.int32), _gnorm(g), tr,
                    jnp.asarray(FIXED_ITER, jnp.int32))

  value0, g0, _ = fun(x0)
  gtol = tol * tol_scale

  def cond(c):
    i, x, m, v, value, g, _ = c
    return (i < max_iter) & (_gnorm(g) > gtol)

  def body(c):
    i, x, m, v, value, g, tr = c
    x, m, v = step(i, x, m, v, g)
    value, g, _ = fun(x)
    tr = _record(tr, i, value, g, i + 2)
    return i + 1, x, m, v, value, g, tr

  i, x, _, _, value, g, tr = lax.while_loop(
      cond, body, (jnp.asarray(0, jnp.int32), x0, zeros, zeros, value0, g0, tr0))
  status = jnp.where(_gnorm(g) <= gtol, CONVERGED, MAX_ITER).astype(jnp.int32)
  return OptState(x, value, g, i, i + 1, _gnorm(g), _finish_trace(tr, i, i + 1), status)


def _store_pair(S, Y, STY, YTY, slot, s, y, sy, store):
  """The L-BFGS history with the pair (s, y), s.y = sy, in ring slot `slot`
  (if `store`).

  S, Y (M, d): the steps s_i and gradient changes y_i by slot (empty slots are
  zero). STY[i, j] = s_i . y_j and YTY[i, j] = y_i . y_j (M, M), kept up to
  date with three matrix-vector products of the history with the new pair.
  """
  S = S.at[slot].set(jnp.where(store, s, S[slot]))
  Y = Y.at[slot].set(jnp.where(store, y, Y[slot]))
  S_dot_y, Y_dot_y, s_dot_Y = S @ y, Y @ y, Y @ s
  # The diagonal s.y is the value the caller tested (a differently rounded
  # s.y, with cancellation near the optimum, would scale the pair differently).
  new_STY = STY.at[slot, :].set(s_dot_Y).at[:, slot].set(S_dot_y).at[slot, slot].set(sy)
  new_YTY = YTY.at[slot, :].set(Y_dot_y).at[:, slot].set(Y_dot_y)
  return S, Y, jnp.where(store, new_STY, STY), jnp.where(store, new_YTY, YTY)


def _lbfgs_inverse_hessian_times(g, S, Y, STY, YTY, gamma0, head):
  """H g for the L-BFGS inverse-Hessian approximation H of the stored pairs.

  The compact form of Byrd, Nocedal and Schnabel (1994):
  H = gamma0 I + [S  gamma0 Y] W [S  gamma0 Y]^T with the 2M x 2M middle
  matrix W built from R = triu(S^T Y) (pairs in chronological order),
  D = diag(S^T Y) and Y^T Y. Equal to the two-loop recursion, but the
  (M, d) history is read in four matrix-vector products where the two-loop
  makes 4M vector operations (docs/OT.md, "Kernel timings"). Slot j of the
  ring holds pair number head - M + ((j - head) mod M); empty slots
  (head < M) are zero and drop out.
  """
  M = STY.shape[0]
  order = (head + jnp.arange(M)) % M                 # slots, oldest first
  filled = jnp.arange(M) >= M - jnp.minimum(head, M)
  u, v = (S @ g)[order], (Y @ g)[order]
  STY_c = STY[order][:, order]
  D = jnp.diagonal(STY_c)
  # Empty slots: a unit diagonal keeps R invertible; their rows and columns are
  # zero, so their coefficients come out zero.
  R = jnp.triu(STY_c) + jnp.diag(jnp.where(filled, 0, 1).astype(g.dtype))
  p1 = jax.scipy.linalg.solve_triangular(R, u, lower=False)
  rhs = D * p1 + gamma0 * (YTY[order][:, order] @ p1) - gamma0 * v
  top = jax.scipy.linalg.solve_triangular(R, rhs, trans="T", lower=False)
  coef_S = jnp.zeros((M,), g.dtype).at[order].set(top)
  coef_Y = jnp.zeros((M,), g.dtype).at[order].set(-gamma0 * p1)
  return gamma0 * g + coef_S @ S + coef_Y @ Y


def lbfgs(fun: Callable, x0: Array, *, max_iter, tol, history: int = 10,
          ftol=0.0, patience=1, rtol=0.0, c1: float = 1e-4,
          max_linesearch: int = 30, trace: bool = False, tol_scale=1.0,
          objective_gate=None) -> OptState:
  """L-BFGS ascent with Armijo backtracking. Stops when max|grad| <= tol * tol_scale, when an
  iteration increases the value by <= ftol * |value| (ftol > 0), after max_iter
  iterations, or when the line search can no longer increase the value.

  The ftol test is what ends runs on non-smooth objectives (k binding: the optimum
  sits on a kink where the gradient does not vanish). It fires only after
  `patience` consecutive small improvements: a single short step (the line search
  backtracking across a kink) is not a sign of convergence, so a looser ftol with
  patience > 1 stops sooner than a tight ftol without false stops.

  rtol > 0 stops once the quasi-Newton model predicts that at most rtol * |value|
  is left to gain: -g^T p / 2 (p the L-BFGS step, g^T p < 0) is the model's
  increase at its maximiser, the Newton decrement's estimate of the suboptimality.
  The test is made before the line search, so a stop costs no evaluation.

  objective_gate: None (off), or the objective rules (rtol, ftol) fire only
  at points where sum |grad| <= objective_gate. On a smooth objective a small predicted gain
  need not mean small marginal errors: with a tiny regularization (gamma
  1e-3 against costs of 1, curvature ~1 / gamma) rtol = 1e-9 stopped the
  semi-dual with its plan's rows 0.2% off, 4% at gamma = 1e-6, where the
  gradient rule alone reached 1e-6 in 30-50 iterations. (At a kink the
  gradient never vanishes: leave the gate off there.)

  max_iter, tol, ftol, patience, rtol and objective_gate may be traced scalars: a rule whose
  tolerance is 0 is off at run time, so one compiled program serves every
  value. With trace=True max_iter must stay a Python int (the trace's
  length)."""
  dtype = x0.dtype
  d = x0.shape[0]
  M = history
  tiny = jnp.finfo(dtype).tiny

  def F(x):  # minimise F = -value
    value, g, _ = fun(x)
    return -value, -g

  f0, g0 = F(x0)
  gtol = tol * tol_scale

  def direction(g, c):
    return -_lbfgs_inverse_hessian_times(g, c.S, c.Y, c.STY, c.YTY, c.gamma0, c.head)

  class Carry(NamedTuple):
    it: Array
    evals: Array
    x: Array
    f: Array
    g: Array
    S: Array
    Y: Array
    STY: Array
    YTY: Array
    head: Array
    gamma0: Array
    stalled: Array
    small: Array
    trace: Optional[OTTrace]
    reason: Array

  def cond(c: Carry):
    return (c.it < max_iter) & ~c.stalled & ((tol <= 0) | (_gnorm(c.g) > gtol))

  def body(c: Carry):
    p = direction(c.g, c)
    gp = jnp.dot(c.g, p)
    # Not a descent direction (should not happen on concave objectives, but
    # rounding): fall back to steepest descent.
    bad = ~(gp < 0)
    p = jnp.where(bad, -c.g, p)
    gp = jnp.where(bad, -jnp.dot(c.g, c.g), gp)

    def ls_cond(s):
      t, ft, gt, ok, moved, n = s
      return ~ok & (n < max_linesearch)

    def ls_body(s):
      t, _, _, _, _, n = s
      ft, gt = F(c.x + t * p)
      armijo = ft <= c.f + c1 * t * gp
      # Approximate Armijo (Hager & Zhang 2005): where the value change is
      # within rounding of the value, F(x + t p) - F(x) ~ t (gp + gt.p) / 2 on
      # the quadratic model, so Armijo reads gt.p <= (2 c1 - 1) gp on slopes,
      # which float32 still resolves.
      flat = jnp.abs(ft - c.f) <= _F_NOISE * jnp.finfo(dtype).eps * jnp.abs(c.f)
      slope = jnp.dot(gt, p)
      approx = flat & (slope <= (2 * c1 - 1) * gp) & (slope >= _SIGMA * gp)
      ok = armijo | approx
      # A step too short to change the value passes Armijo by rounding: it ends
      # the search but is progress only if the slopes say so.
      moved = (ft < c.f) | approx
      # Safeguarded quadratic interpolation of the step on failure.
      denom = 2 * (ft - c.f - gp * t)
      t_q = jnp.where(denom > 0, -gp * t * t / jnp.maximum(denom, tiny), 0.5 * t)
      t_new = jnp.where(jnp.isfinite(ft), jnp.clip(t_q, 0.1 * t, 0.5 * t), 0.5 * t)
      return jnp.where(ok, t, t_new), ft, gt, ok, moved, n + 1

    # Predicted remaining gain small enough: stop without evaluating (ok = True
    # makes the line search loop run zero times; the step is not taken).
    gated = True if objective_gate is None else jnp.sum(jnp.abs(c.g)) <= objective_gate
    done = (rtol > 0) & ~bad & (c.it > 0) & (-0.5 * gp <= rtol * jnp.abs(c.f)) & gated
    t0 = jnp.where(c.it == 0, jnp.minimum(1.0, 1.0 / jnp.maximum(jnp.sqrt(-gp), tiny)),
                   1.0).astype(dtype)
    t, f_new, g_new, ok, moved, n = lax.while_loop(
        ls_cond, ls_body, (t0, c.f, c.g, done, jnp.asarray(False), jnp.asarray(0, jnp.int32)))
    ok = ok & ~done
    s = t * p
    y = g_new - c.g
    sy = jnp.dot(s, y)
    yy = jnp.dot(y, y)
    # A gradient change at rounding level is not curvature: on a piecewise-linear
    # stretch of the objective y is pure noise (float32: ~1e-8 |g|), and sy / yy
    # would then scale the next step by orders of magnitude, far past where the
    # objective can still be evaluated accurately. Keep only pairs whose y stands
    # out of the noise of the gradients it is the difference of.
    y_noise = jnp.sqrt(jnp.finfo(dtype).eps) * jnp.maximum(_gnorm(c.g), _gnorm(g_new))
    upd = ok & (sy > jnp.finfo(dtype).eps * yy) & (sy > 0) & (_gnorm(y) > y_noise)
    S, Y, STY, YTY = _store_pair(c.S, c.Y, c.STY, c.YTY, c.head % M, s, y, sy, upd)
    head = c.head + upd.astype(c.head.dtype)
    # No pair stored yet and this full step's gradient change was lost in the
    # rounding: the step was too short to measure curvature, and without a
    # pair L-BFGS would crawl at this length forever (float32 with marginals of
    # large total mass, where the per-unit objective's natural step is
    # thousands of times the first one). Lengthen the next step tenfold; the
    # line search takes back any excess.
    too_short = (c.head == 0) & ok & ~upd & (n == 1) & ~(_gnorm(y) > y_noise)
    gamma0 = jnp.where(upd, sy / jnp.maximum(yy, tiny),
                       jnp.where(too_short, 10 * c.gamma0, c.gamma0))
    x = jnp.where(ok, c.x + s, c.x)
    f = jnp.where(ok, f_new, c.f)
    g = jnp.where(ok, g_new, c.g)
    # No accepted step, or one that made no progress: the line search is at
    # rounding level. Stop.
    no_gain = (~ok | ~moved) & ~done
    objective_stop = done
    # ftol: both the achieved and the predicted gain must be small: a short
    # step alone (backtracking across a kink) is no sign of convergence.
    tiny_gain = (c.f - f_new <= ftol * jnp.abs(f_new)) & (-0.5 * gp <= ftol * jnp.abs(c.f))
    small = jnp.where(ftol > 0, jnp.where(tiny_gain, c.small + 1, 0), c.small)
    objective_stop = objective_stop | ((ftol > 0) & ok & (small >= patience) & gated)
    stalled = no_gain | objective_stop
    reason = jnp.where(objective_stop, OBJECTIVE_TOL, jnp.where(no_gain, STALLED, c.reason))
    # An iteration stopped by rtol before its line search is not counted (nor
    # recorded): it took no step.
    tr = c.trace
    if trace:
      new = _record(tr, c.it, -f, -g, c.evals + n)
      tr = jax.tree_util.tree_map(lambda u, o: jnp.where(done, o, u), new, tr)
    return Carry(c.it + (~done).astype(c.it.dtype), c.evals + n, x, f, g, S, Y, STY, YTY, head,
                 gamma0, stalled, small, tr, reason.astype(jnp.int32))

  init = Carry(jnp.asarray(0, jnp.int32), jnp.asarray(1, jnp.int32), x0, f0, g0,
               jnp.zeros((M, d), dtype), jnp.zeros((M, d), dtype), jnp.zeros((M, M), dtype),
               jnp.zeros((M, M), dtype),
               jnp.asarray(0, jnp.int32), jnp.asarray(1.0, dtype), jnp.asarray(False),
               jnp.asarray(0, jnp.int32),
               _empty_trace(max_iter, dtype) if trace else None,
               jnp.asarray(MAX_ITER, jnp.int32))
  c = lax.while_loop(cond, body, init)
  status = jnp.where((tol > 0) & (_gnorm(c.g) <= gtol), CONVERGED, c.reason)
  return OptState(c.x, -c.f, -c.g, c.it, c.evals, _gnorm(c.g),
                  _finish_trace(c.trace, c.it, c.evals), status)
