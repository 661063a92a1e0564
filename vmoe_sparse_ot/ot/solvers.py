"""`solve`: regularized (sparsity-constrained) OT through its dual or semi-dual.

Maximises the dual D(alpha, beta) or the semi-dual S(alpha) (paper eqs. reg_dual,
reg_semi_dual) with L-BFGS or Adam, recovers the plan from the conjugate's
gradient, and reports the duality gap P(T) - value, P the convex primal the
optimum solves (P_Psi for SparsityConstrained, Prop. biconjugates).

Everything after the argument checks is one jitted function with static options,
so `solve` runs eagerly, under `jit` and under `vmap` (many problems at once).
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.ot import objectives
from vmoe_sparse_ot.ot import optim
from vmoe_sparse_ot.ot import validation
from vmoe_sparse_ot.ot.regularizers import Regularizer, SparsityConstrained

Array = jax.Array

FORMULATIONS = ("semi_dual", "dual")
SOLVERS = ("lbfgs", "adam")


class OTResult(NamedTuple):
  """Result of `solve` (a pytree; every field gains a leading axis under vmap).

  plan: (m, n) transport plan recovered from the potentials.
  value: the dual / semi-dual objective at the returned potentials.
  alpha: (m,) potential of the rows.
  beta: (n,) potential of the columns; for the semi-dual, beta_j = dS/db_j (the
    potential that makes the semi-dual plan the dual one).
  num_iter: solver iterations run.
  grad_norm: max |gradient| of the objective = largest marginal violation of plan.
  converged: grad_norm <= tol (always False for tol == 0).
  duality_gap: P(plan) - value, P the convex primal <T, C> + sum_j Omega**(t_j)
    (gamma Psi for SparsityConstrained). Not a certificate unless the marginals
    hold, i.e. grad_norm is small.
  num_evals: objective evaluations (line-search trials included).
  trace: `OTTrace` of per-iteration value, gradient norm and evaluation count
    when solved with trace=True; None otherwise.
  """
  plan: Array
  value: Array
  alpha: Array
  beta: Array
  num_iter: Array
  grad_norm: Array
  converged: Array
  duality_gap: Array
  num_evals: Array
  trace: Optional[optim.OTTrace] = None


def _float_dtype(*xs):
  dt = jnp.result_type(*xs)
  if not jnp.issubdtype(dt, jnp.floating):
    dt = jnp.result_type(float)
  return dt


def _plan_primal(reg: Regularizer, T: Array) -> Array:
  """sum_j Omega**(t_j) for a plan from the solvers (columns have <= k nonzeros).

  For such columns Psi(t) = 1/2 ||t||^2 exactly (lambda = 1 on the support), so no
  sort is needed.
  """
  if isinstance(reg, SparsityConstrained):
    return 0.5 * reg.gamma * jnp.sum(T * T)
  return jnp.sum(reg.primal(T, axis=0))


def _prepare_init(init, m: int, n: int, formulation: str, dtype):
  if init is None:
    return jnp.zeros((m,), dtype), jnp.zeros((n,), dtype)
  if isinstance(init, OTResult):
    alpha, beta = init.alpha, init.beta
  elif isinstance(init, (tuple, list)):
    if len(init) != 2:
      raise ValueError("init must be alpha (m,), a pair (alpha, beta) or an OTResult")
    alpha, beta = init
  else:
    alpha, beta = init, None
  alpha = jnp.asarray(alpha)
  if alpha.shape != (m,):
    raise ValueError(f"init alpha must have shape ({m},), got {alpha.shape}")
  if beta is None:
    beta = jnp.zeros((n,), dtype)
  beta = jnp.asarray(beta)
  if beta.shape != (n,):
    raise ValueError(f"init beta must have shape ({n},), got {beta.shape}")
  return alpha.astype(dtype), beta.astype(dtype)


def solve(a, b, C, regularizer: Regularizer, formulation: str = "semi_dual",
          solver: str = "lbfgs", max_iter: int = 1000, tol: float = 1e-6,
          learning_rate: float = 1e-2, init: Optional[Any] = None,
          history: int = 10, ftol: float = 0.0, patience: int = 1,
          rtol: float = 0.0, trace: bool = False) -> OTResult:
  """Solves regularized OT: min_T <T, C> + sum_j Omega(t_j) over couplings of a, b.

  Args:
    a: (m,) non-negative row marginal.
    b: (n,) non-negative column marginal, same total mass as `a`.
    C: (m, n) finite real cost (any sign: C + const gives the same plan).
    regularizer: `SparsityConstrained(k, gamma)` (at most k nonzeros per column;
      k >= m behaves as SquaredL2), `SquaredL2(gamma)` or `NegEntropy(gamma)`.
    formulation: "semi_dual" (max over alpha) or "dual" (max over alpha, beta).
    solver: "lbfgs" or "adam".
    max_iter: Python int >= 1, iteration budget.
    tol: Python float >= 0; stop once the largest marginal violation (max |grad|)
      is <= tol. tol == 0 runs exactly `max_iter` iterations (Adam: a fixed-length
      loop with no convergence test; L-BFGS may stop early only if its line search
      can no longer increase the objective).
    learning_rate: Adam step size (ignored by L-BFGS).
    init: warm start: alpha (m,), (alpha, beta), or a previous OTResult.
    history: L-BFGS memory size.
    ftol: L-BFGS also stops once an iteration improves the objective by at most
      ftol * |objective| and its model predicts no more than that is left
      (-g^T p / 2; both, so a short step across a kink does not stop it; 0: off). Needed to stop on non-smooth problems (binding
      k puts the optimum on a kink, where the gradient does not vanish).
    patience: L-BFGS: the ftol test must hold this many iterations in a row.
    rtol: L-BFGS also stops once its quasi-Newton model predicts a remaining
      increase of at most rtol * |objective| (-g^T p / 2; 0: off). Compares the
      progress still attainable with the precision asked, so it stops near the
      optimum on smooth and kinked problems alike, at no extra evaluation.
    trace: Python bool; True records per iteration the objective, the gradient
      norm and the evaluation count in `result.trace` (an `OTTrace`, each field
      (max_iter,)). Off, nothing is recorded.

  Returns:
    OTResult. Float dtype follows the inputs (float32 or float64 under x64).

  Raises:
    ValueError naming the argument, before compiling: shape mismatch, negative or
    non-finite marginals, non-finite costs, different total masses (value checks only for
    concrete, non-traced inputs), k < 1, gamma <= 0, unknown options.
  """
  if not isinstance(regularizer, Regularizer):
    raise ValueError(
        "regularizer must be SparsityConstrained, SquaredL2 or NegEntropy, got "
        f"{type(regularizer).__name__}")
  validation.check_choice("formulation", formulation, FORMULATIONS)
  validation.check_choice("solver", solver, SOLVERS)
  max_iter = validation.check_int("max_iter", max_iter, 1)
  history = validation.check_int("history", history, 1)
  patience = validation.check_int("patience", patience, 1)
  tol = validation.check_nonneg_float("tol", tol)
  ftol = validation.check_nonneg_float("ftol", ftol)
  rtol = validation.check_nonneg_float("rtol", rtol)
  learning_rate = validation.check_pos_float("learning_rate", learning_rate)
  if not isinstance(trace, bool):
    raise ValueError(f"trace must be a Python bool, got {trace!r}")
  if not validation.is_concrete(learning_rate):
    raise ValueError("learning_rate must be a Python float (static), not a traced value")
  learning_rate = float(learning_rate)
  validation.check_problem(a, b, C)
  regularizer.validate()
  dtype = _float_dtype(a, b, C)
  m, n = C.shape
  alpha0, beta0 = _prepare_init(init, m, n, formulation, dtype)
  a = jnp.asarray(a, dtype)
  b = jnp.asarray(b, dtype)
  C = jnp.asarray(C, dtype)
  return _solve(a, b, C, regularizer, alpha0, beta0, formulation=formulation,
                solver=solver, max_iter=max_iter, tol=tol, learning_rate=learning_rate,
                history=history, ftol=ftol, patience=patience, rtol=rtol, trace=trace)


@functools.partial(jax.jit, static_argnames=(
    "formulation", "solver", "max_iter", "tol", "learning_rate", "history", "ftol",
    "patience", "rtol", "trace"))
def _solve(a, b, C, reg, alpha0, beta0, *, formulation, solver, max_iter, tol,
           learning_rate, history, ftol, patience, rtol, trace) -> OTResult:
  m, n = C.shape
  if formulation == "semi_dual":
    def fun(x):
      return objectives.semi_dual_value_and_grad(x, a, b, C, reg)
    x0 = alpha0
  else:
    def fun(x):
      value, (ga, gb), T = objectives.dual_value_and_grad(x[:m], x[m:], a, b, C, reg)
      return value, jnp.concatenate([ga, gb]), T
    x0 = jnp.concatenate([alpha0, beta0])

  if solver == "adam":
    st = optim.adam(fun, x0, max_iter=max_iter, tol=tol, learning_rate=learning_rate,
                    trace=trace)
  else:
    st = optim.lbfgs(fun, x0, max_iter=max_iter, tol=tol, history=history, ftol=ftol,
                     patience=patience, rtol=rtol, trace=trace)

  if formulation == "semi_dual":
    alpha = st.x
    vals, T, dval_db = reg.conj_simplex(alpha[:, None] - C, b, axis=0)
    value = jnp.dot(alpha, a) - jnp.sum(vals)
    beta = -dval_db
  else:
    alpha, beta = st.x[:m], st.x[m:]
    T = objectives.plan_from_dual(alpha, beta, C, reg)
    value = st.value
  primal = jnp.sum(T * C) + _plan_primal(reg, T)
  converged = st.grad_norm <= tol if tol > 0 else jnp.asarray(False)
  return OTResult(plan=T, value=value, alpha=alpha, beta=beta, num_iter=st.num_iter,
                  grad_norm=st.grad_norm, converged=converged,
                  duality_gap=primal - value, num_evals=st.num_evals, trace=st.trace)


def semi_dual_loss(a, b, C, regularizer: Regularizer, **solve_kwargs) -> Array:
  """S(a, b, C), the semi-dual optimal value, as a differentiable loss.

  Gradients by Danskin's theorem, without unrolling the solver (paper section 4):
  dS/da = alpha*, dS/dC = T*, dS/db = beta* (see OTResult.beta). Since S is
  invariant to shifting alpha when sum(a) = sum(b), dS/da is defined up to a
  constant: use it along mass-preserving directions. `solve_kwargs` go to `solve`
  (formulation is always "semi_dual").
  """
  solve_kwargs = dict(solve_kwargs)
  solve_kwargs.pop("formulation", None)

  @jax.custom_vjp
  def loss(a, b, C, reg):
    return solve(a, b, C, reg, formulation="semi_dual", **solve_kwargs).value

  def fwd(a, b, C, reg):
    res = solve(a, b, C, reg, formulation="semi_dual", **solve_kwargs)
    return res.value, (res.alpha, res.beta, res.plan, reg)

  def bwd(resid, g):
    alpha, beta, T, reg = resid
    zeros = jax.tree_util.tree_map(jnp.zeros_like, reg)
    return g * alpha, g * beta, g * T, zeros

  loss.defvjp(fwd, bwd)
  return loss(a, b, C, regularizer)
