"""Many small sparsity-constrained semi-duals at once by a damped semi-smooth Newton method.

The router's problems (expert-choice form: m = S tokens of mass 1, n = E experts
of mass S/E, at most k = C tokens per expert) in a handful of sequential steps
instead of Adam's fifty. Each step is one evaluation of the semi-dual's
gradient -- the top-k sparse simplex projection of every column, the same
kernel as `batched.batched_semi_dual_adam` -- plus a small linear solve.

The semi-dual S(alpha) = <alpha, a> - sum_j Omega*_{b_j}(alpha - c_j) is concave
and piecewise quadratic. On a piece (fixed supports P_j of the plan's columns,
n_j = |P_j|) its negative Hessian is

    M = (1/gamma) (D - sum_j 1_{P_j} 1_{P_j}^T / n_j),   D = diag(#columns holding row i),

PSD, singular along the all-ones vector and for the rows in no support. The
step solves (M + diag(1 / r)) d = grad S(alpha): a Newton step damped per row by
a trust length r_i (cost units, as alpha), the Levenberg-Marquardt form of a
diagonal trust region. With m <= n the (m, m) system is formed directly; with
n < m (the expert-choice form: n = E experts) the Woodbury identity turns it into
an (n, n) one, K = gamma diag(n_j) - S^T diag(1/A) S with A = diag(D/gamma +
1/r), which is strictly diagonally dominant (every row's 1 / A_ii < gamma), so
it never needs a pivot or a pseudo-inverse.

The optimum sits on kinks: where more rows want a column than its k places,
they tie at its k-th value, and the pieces change under any finite step. What
handles them (chosen by measurement on the router's problems; benchmarks/
router_solvers.py, docs/OT.md):

- r_i starts at `trust` times the row's cost scale sigma_i (the spread of
  C_i. across the columns) over the square root of its mass a_i, and shrinks by
  `shrink` when the row's gradient changes sign: the row has stepped over its
  kink.
- A row whose gradient changed sign goes back to the secant estimate of its
  root within the bracket it just found (the fraction g / (g - g_prev) of its
  last step, kept within [0.05, 0.95]) instead of taking the Newton step; the
  last 4 steps are plain Newton steps (they lower the marginal error).
- No line search: every evaluation is a step, and a step never costs more than
  one evaluation.

Stop rule: the Newton model's gain, 1/2 <grad, d>, at most `tol` times the scale
sum_i a_i sigma_i (so the rule is unchanged by C -> C + const and by scaling C
and gamma together). A group that meets it stops
(its alpha is frozen and its `steps` counts the evaluations it used, the one that
met the rule included); the loop ends when every group has stopped or after
`max_steps` evaluations. The plan is the projection at the final alpha (one more
evaluation, as for Adam's plan after its last step).

How close it gets, against Adam-50 on the same problems (benchmarks/
router_solvers.py; tests/ot/test_newton.py):
- at the B/32 routing shapes (S = 400, E = 32, k = 28), both forms, logit
  scales 1 and 4: in 10 steps a semi-dual gap and a row-mass error no larger
  (0.34-0.93x and 0.52-0.96x; benchmarks/RESULTS.md, "The router's solvers");
- at the tiny config's (S = 64, E = 8, k = 16): a row-mass error no larger, a
  gap no larger at logit scales 1 and 2 and within 5% at scale 4 (0.92-1.04x
  over three seeds);
- elsewhere (E k close to S with peaked logits, S not a multiple of E, token
  choice at small sizes): in 10 steps a gap within 2.5x and a row-mass error
  within 1.35x (measured up to 2.0x and 1.31x); with max_steps=30 no larger
  than Adam-50's;
- where E k < S (no k-sparse plan meets the rows) 10 steps are far from enough:
  give it 30 (then it beats Adam-50) or use Adam.

Shapes: G problems, m rows, n columns per problem, N = n * G columns in all
(expert-major, as in `batched`).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from vmoe_sparse_ot.ot import batched
from vmoe_sparse_ot.ot import precision

Array = jax.Array

# Chosen on the router's B/32 problems (S = 400, E = 32, k = 28, gamma = 1,
# cost -softmax of N(0, s^2) logits, s = 1 and 4), checked on the tiny
# config's and tighter shapes: the settings that match Adam-50's semi-dual gap
# and row-mass error at both scales in 10 steps (benchmarks/router_solvers.py;
# RESULTS.md, "The router's solvers"). tol: at these shapes no group meets it
# within 10 steps (the rule stops the easy problems: k not binding, all costs
# equal), so the cap decides there.
DEFAULT_MAX_STEPS = 10
DEFAULT_TRUST = 1.3
DEFAULT_SHRINK = 0.25
DEFAULT_TOL = 1e-6
# Floor of the costs' scale, in units of gamma * mean(b) / k (the move of alpha
# that shifts one k-th of a column's mass): only near-constant costs reach it.
_SCALE_FLOOR = 1e-6
# The secant fraction of the last step a row that crossed its kink goes back.
_SECANT_RANGE = (0.05, 0.95)
# The last steps are plain (damped) Newton steps, without the secant step back:
# they lower the row-mass error (4 of 10: Adam-50's error with a margin at the
# B/32 and tiny-config shapes, benchmarks/router_solvers.py).
_PLAIN_LAST = 4
_HIGHEST = lax.Precision.HIGHEST


class NewtonResult(NamedTuple):
  """plan (G, m, n); alpha (G, m); steps (G,) int32, gradient evaluations used
  (the final plan's projection not counted); converged (G,) bool, met the stop
  rule within max_steps."""
  plan: Array
  alpha: Array
  steps: Array
  converged: Array


def cost_scale(C: Array, b: Array, k: int, gamma) -> Array:
  """(G, m) sigma_i: the std of C_i. over the columns with mass (padding left out).

  The floor `_SCALE_FLOOR * gamma * mean(b) / k` keeps it positive for rows of
  constant cost.
  """
  wb = (b > 0).astype(C.dtype)[:, None, :]                              # (G, 1, n)
  nb = jnp.maximum(jnp.sum(wb, axis=-1), 1)                             # (G, 1)
  mean = jnp.sum(wb * C, axis=-1) / nb                                  # (G, m)
  var = jnp.sum(wb * (C - mean[..., None]) ** 2, axis=-1) / nb
  floor = _SCALE_FLOOR * gamma * jnp.sum(b, axis=-1, keepdims=True) / (b.shape[-1] * k)
  return jnp.maximum(jnp.sqrt(var), floor)


def _spd_solve(mat: Array, rhs: Array) -> Array:
  """x (G, p) with mat x = rhs for symmetric positive definite mat (G, p, p).

  By Cholesky: both systems here are SPD (the damped M, and Woodbury's K,
  strictly diagonally dominant), and the factorisation compiles to half the
  program of `jnp.linalg.solve`'s pivoted LU with its autodiff rules (the
  router's train step compiles this once per MoE layer).
  """
  low = lax.linalg.cholesky(mat, symmetrize_input=False)
  y = lax.linalg.triangular_solve(low, rhs[..., None], left_side=True, lower=True)
  return lax.linalg.triangular_solve(low, y, left_side=True, lower=True,
                                     transpose_a=True)[..., 0]


def newton_direction(t: Array, grad: Array, damping: Array, gamma) -> Array:
  """d (m, G) solving (M + diag(damping)) d = grad on each group's current piece.

  t: (m, n, G) the plan's columns (their supports P_j are t > 0); grad, damping:
  (m, G), damping > 0. M as in the module docstring.
  """
  m, n, _ = t.shape
  s = (t > 0).astype(t.dtype)                                           # (m, n, G)
  count = jnp.sum(s, axis=1)                                            # (m, G)
  size = jnp.sum(s, axis=0)                                             # (n, G)
  diag = count / gamma + damping                                        # (m, G)
  if m <= n:
    h = jnp.einsum("ijg,ljg->gil", s / jnp.maximum(size, 1)[None], s, precision=_HIGHEST)
    h = jnp.vectorize(jnp.diag, signature="(m)->(m,m)")(diag.T) - h / gamma
    return _spd_solve(h, grad.T).T
  # Woodbury: n x n. An empty column (no mass) gets K_jj = gamma and no coupling.
  k_mat = jnp.einsum("ijg,ilg->gjl", s / diag[:, None, :], s, precision=_HIGHEST)
  eye = jnp.eye(n, dtype=t.dtype)
  k_mat = gamma * jnp.maximum(size, 1).T[:, :, None] * eye - k_mat
  scaled = grad / diag                                                  # (m, G)
  rhs = jnp.einsum("ijg,ig->gj", s, scaled, precision=_HIGHEST)
  y = _spd_solve(k_mat, rhs)                                            # (G, n)
  return scaled + jnp.einsum("ijg,gj->ig", s, y, precision=_HIGHEST) / diag


def batched_semi_dual_newton(C: Array, a: Array, b: Array, k: int, gamma=1.0, *,
                             max_steps: int = DEFAULT_MAX_STEPS, tol=DEFAULT_TOL,
                             trust=DEFAULT_TRUST, shrink=DEFAULT_SHRINK) -> NewtonResult:
  """G sparsity-constrained semi-duals by damped semi-smooth Newton from alpha = 0.

  Args:
    C: (G, m, n) finite costs; a: (G, m) row marginals; b: (G, n) column
      marginals, each group's totals equal (rows or columns of mass 0 are
      padding: they get no mass and do not move the others' solution).
    k: static int >= 1, at most k nonzeros per column.
    gamma: > 0, the squared-L2 strength (may be traced).
    max_steps: static int >= 1, the cap on gradient evaluations per group.
    tol: >= 0, the stop rule's tolerance (module docstring); 0 runs max_steps.
    trust: > 0, the initial trust length in units of the costs' scale.
    shrink: in (0, 1), the trust's factor when a row's gradient changes sign.

  Returns:
    `NewtonResult` (plan (G, m, n) with at most k nonzeros per column, alpha,
    steps, converged), in C's dtype (float32 for float16 / bfloat16 inputs,
    computed in float32: `ot.precision`). No gradient flows through the solve:
    its inputs are taken through `lax.stop_gradient` (a loop of selections
    with a data-dependent exit has no useful derivative).
  """
  C, a, b, gamma = (lax.stop_gradient(x) for x in precision.upcast((C, a, b, gamma)))
  g_count, m, n = C.shape
  dtype = C.dtype
  ct = jnp.transpose(C, (1, 2, 0)) / gamma                              # (m, n, G)
  b_cols = b.T.reshape(1, n * g_count)
  a_rows = a.T                                                          # (m, G)
  sigma = cost_scale(C, b, k, gamma).T                                  # (m, G)
  gain_tol = tol * jnp.sum(a_rows * sigma, axis=0)                      # (G,)
  lo, hi = _SECANT_RANGE

  def project(alpha):                                                   # (m, G) -> (m, n, G)
    u = alpha[:, None, :] / gamma - ct
    plan = batched._sparse_projection(u.reshape(m, n * g_count), k, b_cols, lambda t: t)
    return plan.reshape(m, n, g_count)

  def body(carry):
    i, alpha, trust_len, sign_prev, grad_prev, step_prev, active, steps = carry
    t = project(alpha)
    grad = a_rows - jnp.sum(t, axis=1)                                  # (m, G)
    sign = jnp.sign(grad)
    flipped = sign * sign_prev < 0
    trust_len = jnp.where(flipped, trust_len * shrink, trust_len)
    d = newton_direction(t, grad, 1.0 / trust_len, gamma)
    gain = 0.5 * jnp.sum(grad * d, axis=0)                              # (G,)
    done = gain <= gain_tol
    # Within the bracket a sign change found, the secant estimate of the row's
    # root; not on the last steps.
    back = jnp.clip(grad / jnp.where(flipped, grad - grad_prev, 1), lo, hi)
    d = jnp.where(flipped & (i < max_steps - _PLAIN_LAST), -back * step_prev, d)
    moving = active & ~done                                             # (G,)
    d = jnp.where(moving[None], d, 0)
    return (i + 1, alpha + d, trust_len, jnp.where(flipped, 0, sign), grad, d,
            moving, steps + active.astype(jnp.int32))

  def cond(carry):
    return (carry[0] < max_steps) & jnp.any(carry[6])

  zeros = jnp.zeros((m, g_count), dtype)
  # Rows of larger mass (the token-choice form's experts, S/E each) move by less
  # per unit of their (larger) gradient: trust / sqrt(a_i), measured at the B/32
  # and tiny-config shapes in both forms (benchmarks/router_solvers.py).
  trust0 = (trust * sigma / jnp.sqrt(jnp.where(a_rows > 0, a_rows, 1))).astype(dtype)
  init = (jnp.int32(0), zeros, trust0, zeros, zeros, zeros, jnp.ones((g_count,), bool),
          jnp.zeros((g_count,), jnp.int32))
  _, alpha, _, _, _, _, active, steps = lax.while_loop(cond, body, init)
  plan = jnp.transpose(project(alpha), (2, 0, 1))
  return NewtonResult(plan=plan, alpha=alpha.T, steps=steps, converged=~active)
