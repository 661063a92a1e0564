"""`solve`: regularized (sparsity-constrained) OT through its dual or semi-dual.

Maximises the dual D(alpha, beta) or the semi-dual S(alpha) (paper eqs. reg_dual,
reg_semi_dual) with L-BFGS or Adam, recovers the plan from the conjugate's
gradient, and reports the duality gap P(T) - value, P the convex primal the
optimum solves (P_Psi for SparsityConstrained, Proposition 3 (biconjugates)).

The solver after the argument checks is one jitted function, so `solve` runs
eagerly, under `jit` and under `vmap` (many problems at once); only the eager
finish of kink-bound runs (docs/OT.md, "Kinks and the interior point") works
on the host between jitted steps. Its numeric options (tolerances, budget,
learning rate) are arguments of that program, not constants in it: solving
the same shapes with other options compiles nothing new. The options of each
method live on its object (`solver_options.LBFGS`, `Adam`).
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp

from vmoe_sparse_ot.ot import interior_point as ipm
from vmoe_sparse_ot.ot import objectives
from vmoe_sparse_ot.ot import optim
from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import results
from vmoe_sparse_ot.ot import solver_options
from vmoe_sparse_ot.ot import validation
from vmoe_sparse_ot.ot.regularizers import NegEntropy, Regularizer, SparsityConstrained
from vmoe_sparse_ot.ot.results import (
    PLAN_FEASIBLE_RTOL,
    OTResult,
    check_k_sparse_feasible,
    semi_dual_at,
)
from vmoe_sparse_ot.ot.solver_options import LBFGS, Adam

Array = jax.Array

FORMULATIONS = ("semi_dual", "dual")


def _park(x, live, C, ceiling, gamma):
  """Potentials of zero-mass rows (live False) set to min_j (c_ij + ceiling_j) - 40 gamma.

  A row without mass must receive none. Once it gets none its part of the
  objective is flat, so a solver could only push its potential down step by
  step across a kink (L-BFGS stalls there). Instead it is set, from the other
  potentials, low enough that x_i - c_ij <= ceiling_j - 40 gamma for every j:
  the live rows then see exactly the problem without those rows (NegEntropy:
  up to a relative exp(-40) of mass).
  """
  park = jnp.min(C + ceiling[None, :], axis=1) - 40.0 * gamma
  return jnp.where(live, x, jnp.minimum(x, park))


def _park_semi_dual(alpha, a, b, C, reg):
  """Semi-dual: a column's simplex threshold is >= max_i (alpha_i - c_ij) - gamma b_j."""
  top = jnp.max(jnp.where((a > 0)[:, None], alpha[:, None] - C, -jnp.inf), axis=0)
  return _park(alpha, a > 0, C, top - reg.gamma * b, reg.gamma)


def _park_dual(alpha, beta, a, b, C, reg):
  """Dual: no mass where alpha_i + beta_j - c_ij < 0; zero-mass rows, then columns."""
  zeros_n, zeros_m = jnp.zeros_like(beta), jnp.zeros_like(alpha)
  alpha = _park(alpha, a > 0, C - beta[None, :], zeros_n, reg.gamma)
  beta = _park(beta, b > 0, C.T - alpha[None, :], zeros_m, reg.gamma)
  return alpha, beta


@precision.half_in_float32
def c_transform_start(b: Array, C: Array, reg: Regularizer) -> Array:
  """(m,) the semi-dual's default start: a soft minimum of each row of C.

  alpha_i = -eps log sum_j (b_j / sum(b)) exp(-C_ij / eps), the entropic
  c-transform of beta = 0 (min_j C_ij over the columns with mass as eps -> 0),
  with eps a tenth of the regularizer's cost scale: gamma for NegEntropy,
  gamma mean(b) for the quadratic regularizers (gamma t has cost units there;
  the mean over the columns with mass), at most the costs' mean row spread.

  Why: from alpha = 0 the rows far from every column get no mass until the
  solver has lifted them; here each row starts near the top of its best
  column. The hard minimum (eps = 0) would tie the rows that share a best
  column at a kink right at the start; the soft minimum separates them.
  Rows of a C with no column of mass (nothing to transport) start at 0.
  What it saves: docs/OT.md, "Starting point".

  Args:
    b: (n,) non-negative column marginal.
    C: (m, n) cost.
    reg: the regularizer (its gamma sets eps).

  Returns:
    (m,) alpha in C's dtype (float32 for half-precision C).
  """
  live = b > 0
  mass = jnp.sum(b)
  mean_b = mass / jnp.maximum(jnp.sum(live), 1)          # over the columns with mass
  scale = reg.gamma * (1.0 if isinstance(reg, NegEntropy) else mean_b)
  # Capped by the costs' own spread (the mean over rows of max_j C_ij -
  # min_j C_ij): with large masses per column gamma mean(b) can exceed every
  # cost difference, and the start then flattens into a row average
  # (docs/OT.md, "Starting point").
  spread = jnp.mean(jnp.max(jnp.where(live, C, -jnp.inf), axis=1)
                    - jnp.min(jnp.where(live, C, jnp.inf), axis=1))
  eps = jnp.minimum(scale, jnp.where(jnp.isfinite(spread) & (spread > 0), spread, scale)) / 10
  weights = jnp.where(mass > 0, b / mass, 0)
  alpha = -eps * logsumexp(-C / eps, b=weights[None, :], axis=1)
  dtype = C.dtype if jnp.issubdtype(C.dtype, jnp.floating) else alpha.dtype
  return jnp.where(jnp.isfinite(alpha), alpha, 0).astype(dtype)


def _prepare_init(init, m: int, n: int, formulation: str, dtype):
  """(alpha0, beta0) as given, or (None, None): `_solve` then starts from
  `c_transform_start` and beta = 0."""
  if init is None:
    return None, None
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


_DEFAULT_MAX_ITER = 1000
# The interior point's thresholds (docs/OT.md, "How `ot.solve` decides", has
# the measurements behind each).
# Work per Newton step up to which `solve` switches to the interior point on
# its own: on every entry while m n^2 is below it, or on a candidate support
# while n^3 is (its (2n - 1)-square system). Which of the two runs:
# `_DENSE_INTERIOR_POINT_WORK`.
_INTERIOR_POINT_MAX_WORK = 2e7
# L-BFGS's budget before the interior point where k binds for certain
# (`_kink_certain`): enough to aim it at the support in one round of
# candidates.
_KINK_CERTAIN_MAX_ITER = 200
# L-BFGS ended on a kink when its plan's rows miss more than this fraction of
# the mass (sum |a - T 1| / sum(a)): stops short of the optimum missed far
# more, stops at it far less.
_KINK_MISSING_MASS = 1e-3
# m n^2 up to which the interior point runs on every entry even where a
# candidate support is affordable: small problems gain nothing from it.
_DENSE_INTERIOR_POINT_WORK = 2e6


@solver_options.accepts_flat_options
def solve(a, b, C, regularizer: Regularizer, formulation: str = "semi_dual",
          solver: Union[str, LBFGS, Adam] = "lbfgs", max_iter: int = _DEFAULT_MAX_ITER,
          tol: Optional[float] = None, init: Optional[Any] = None, trace: bool = False,
          interior_point: Optional[bool] = None, infeasible: str = "warn") -> OTResult:
  """Solves regularized OT: min_T <T, C> + sum_j Omega(t_j) over couplings T of a and b.

  Maximises the dual or the semi-dual, recovers the plan from the conjugate's
  gradient and reports the duality gap against P_Psi, the convex primal the
  optimum solves. Runs eagerly, under `jit` and under `vmap`. docs/OT.md
  explains the rules below and the measurements behind them.

  Stop rules (`result.status` names the one that fired):
    "converged": the largest marginal violation, max |grad|, <= tol * sum(a).
    "objective_tol" (L-BFGS): its model predicts at most `LBFGS.rtol` *
      |value| left to gain, or `LBFGS.ftol`'s rule held `LBFGS.patience`
      times in a row; on a smooth problem only once the plan meets the
      marginals.
    "max_iter": the budget ran out. "stalled" (L-BFGS): the line search
      found no increase. "fixed_iter" (Adam): tol == 0 ran max_iter iterations.
    "interior_point": L-BFGS ended on a kink (its plan's rows miss > 0.1% of
      the mass, or n k <= m) and `solve_interior_point` finished; only for
      SparsityConstrained with k < m, the semi-dual, L-BFGS, float64,
      positive a and b, concrete inputs, m n^2 or n^3 <= 2e7 (any size with
      interior_point=True).
  `converged` is True only where a rule fired and the plan meets the
  marginals (`plan_feasible`).

  Args:
    a: (m,) non-negative row marginal.
    b: (n,) non-negative column marginal, the same total mass as `a` to the
      dtype's tolerance (`validation.mass_rtol`); rescaled to sum(a).
    C: (m, n) finite real cost, any sign.
    regularizer: `SparsityConstrained(k, gamma)` (at most k nonzeros per
      column), `SquaredL2(gamma)` or `NegEntropy(gamma)`.
    formulation: "semi_dual" (over alpha) or "dual" (over alpha and beta).
    solver: an `LBFGS` or `Adam` object holding that method's options, or
      "lbfgs" / "adam" for the default object.
    max_iter: Python int >= 1, the iteration budget.
    tol: Python float >= 0, or None (1e-6): the marginal tolerance, relative
      to sum(a). 0 runs max_iter iterations (L-BFGS may still stop by its
      objective rule or a stalled line search). Given, it turns the default
      `LBFGS.rtol` off.
    init: None (semi-dual: `c_transform_start`; dual: zeros), alpha (m,),
      a pair (alpha (m,), beta (n,)), or a previous OTResult.
    trace: Python bool; True records per iteration the value, max |grad| and
      the evaluation count in `result.trace` (an `OTTrace`, each (max_iter,)).
    interior_point: None: finish kink-bound runs with the interior point
      under the default stop rules (tol, max_iter and the LBFGS rules not
      given) at the sizes above; True: also with tuned rules, at any size;
      False: never.
    infeasible: "warn", "raise" or "ignore": what happens where no coupling
      has at most k nonzeros per column (n k < the rows with mass): warn once
      (`KSparseInfeasibleWarning`), raise, or go on silently. Unless it
      raises, the solve returns the optimum of P_Psi, its plan rows short.

  Returns:
    OTResult: plan (m, n), value, alpha (m,), beta (n,), duality_gap,
    num_iter, num_evals, status, converged, row_error, col_error,
    plan_feasible (and primal_plan after the interior point), in the inputs'
    float dtype (float16 and bfloat16 inputs are solved in float32).

  Raises:
    ValueError naming the argument, before compiling: shapes; negative or
    non-finite marginals, non-finite costs, different total masses (concrete
    inputs only); a bad regularizer, option or solver field; with
    infeasible="raise", n k < the rows with mass; when differentiated
    (`semi_dual_loss` gives the optimal value's gradient).

  Deprecated: the flat keywords history=, rtol=, ftol=, patience= (fields of
  `LBFGS`) and learning_rate= (of `Adam`) still work, with a DeprecationWarning.
  """
  if not isinstance(regularizer, Regularizer):
    raise ValueError(
        "regularizer must be SparsityConstrained, SquaredL2 or NegEntropy, got "
        f"{type(regularizer).__name__}")
  validation.check_choice("formulation", formulation, FORMULATIONS)
  options = solver_options.resolve(solver)
  lbfgs = isinstance(options, LBFGS)
  max_iter = validation.check_int("max_iter", max_iter, 1)
  tol_given = tol is not None
  tol = validation.check_nonneg_float("tol", 1e-6 if tol is None else tol)
  if not isinstance(trace, bool):
    raise ValueError(f"trace must be a Python bool, got {trace!r}")
  if interior_point not in (None, True, False):
    raise ValueError(f"interior_point must be None, True or False, got {interior_point!r}")
  any_size = interior_point is True
  if interior_point is None:
    tuned = lbfgs and (options.rtol is not None or options.ftol)
    interior_point = not (tol_given or tuned or max_iter != _DEFAULT_MAX_ITER)
  validation.check_problem(a, b, C)
  regularizer.validate()
  a, b, C, regularizer, init = validation.not_differentiable(
      "ot.solve cannot be differentiated (its solvers stop on data-dependent tests): "
      "ot.semi_dual_loss gives the gradient of the optimal value, or stop_gradient its "
      "inputs", (a, b, C, regularizer, init))
  # stacklevel 4: the warning names the line that called ot.solve (through
  # its wrapper, `solver_options.accepts_flat_options`).
  check_k_sparse_feasible(a, C, regularizer, infeasible, stacklevel=4)
  dtype = precision.compute_dtype(a, b, C)   # half precision: float32
  if lbfgs and options.rtol is None:
    options = options._replace(
        rtol=0.0 if tol_given else (1e-9 if dtype == jnp.float64 else 1e-7))
  m, n = C.shape
  alpha0, beta0 = _prepare_init(init, m, n, formulation, dtype)
  a = jnp.asarray(a, dtype)
  b = jnp.asarray(b, dtype)
  C = jnp.asarray(C, dtype)
  offsets = None
  if lbfgs:
    # Row and column offsets out (the same plans; see docs/OT.md, "Scale").
    C, offsets = precision.shift_costs(C)
    if offsets is not None and alpha0 is not None:
      alpha0, beta0 = alpha0 - offsets[0], beta0 - offsets[1]
  finish = (interior_point and formulation == "semi_dual" and lbfgs
            and _interior_point_applies(a, b, C, regularizer, any_size))
  certain = finish and _kink_certain(C, regularizer)
  settings = dict(formulation=formulation, solver=options, tol=tol, trace=trace)
  resume = None
  if certain and max_iter == _DEFAULT_MAX_ITER:
    # L-BFGS only has to point the interior point at the support; should
    # the interior point not improve on it, L-BFGS resumes from there with
    # the rest of its budget.
    max_iter = _KINK_CERTAIN_MAX_ITER

    def resume(alpha):
      return _solve(a, b, C, regularizer, alpha, None, max_iter=_DEFAULT_MAX_ITER -
                    _KINK_CERTAIN_MAX_ITER, result=True, **settings)
  res = _solve(a, b, C, regularizer, alpha0, beta0, max_iter=max_iter, result=not finish,
               **settings)
  if finish:
    # The result at L-BFGS's alpha from the function the interior point
    # scores its multipliers with, so that where it runs the semi-dual's
    # evaluation is compiled once less (docs/OT.md, "How `ot.solve` decides").
    value, T, beta, primal = semi_dual_at(res.alpha, a, b, C, regularizer)
    row, col, feasible = results.host_plan_errors(T, a, b)
    res = _finish_on_kink(res._replace(plan=T, value=value, beta=beta,
                                       duality_gap=primal - value, row_error=row,
                                       col_error=col, plan_feasible=feasible,
                                       converged=res.converged & feasible),
                          a, b, C, regularizer, certain, resume)
  return res if offsets is None else _restore_offsets(res, *offsets, a, b)


def _restore_offsets(res: OTResult, r, c, a, b) -> OTResult:
  """res, solved on C - r - c, in the caller's C: potentials alpha + r and
  beta + c, values up by <r, a> + <c, b> (b matched to a's mass). The
  duality gap of a plan T moves by <r, T 1 - a> + <c, T^T 1 - b> (zero for a
  coupling: primal_plan's, after the interior point)."""
  b = results.matched_mass(b, a)
  const = jnp.dot(r, a) + jnp.dot(c, b)
  gap = res.duality_gap
  if res.primal_plan is None:
    gap = gap + jnp.dot(r, jnp.sum(res.plan, 1) - a) + jnp.dot(c, jnp.sum(res.plan, 0) - b)
  trace = res.trace
  if trace is not None:
    trace = trace._replace(value=trace.value + const)
  return res._replace(alpha=res.alpha + r, beta=res.beta + c, value=res.value + const,
                      duality_gap=gap, trace=trace)


def _interior_point_applies(a, b, C, reg, any_size: bool) -> bool:
  """Whether `solve` may finish with the interior point (see "Kinks")."""
  m, n = C.shape
  return (isinstance(reg, SparsityConstrained) and reg.k < m and n >= 2
          and C.dtype == jnp.float64
          and (any_size or min(m * n * n, n ** 3) <= _INTERIOR_POINT_MAX_WORK)
          and all(validation.is_concrete(x) for x in (a, b, C, reg.gamma))
          and bool(np.all(np.asarray(a) > 0)) and bool(np.all(np.asarray(b) > 0)))


def _kink_certain(C, reg) -> bool:
  """k binds: the semi-dual's plans have at most n k nonzeros, fewer than the
  m rows (all with mass) that each need one when n k < m; at n k = m only a
  plan that is a matching (each row's mass in one column) could avoid it."""
  m, n = C.shape
  return n * reg.k <= m


def _finish_on_kink(res: OTResult, a, b, C, reg, certain: bool, resume=None) -> OTResult:
  """`res`, or the interior point's result where L-BFGS ended on a kink (see
  `solve`, "Kinks"); `_interior_point_applies` holds. resume(alpha): L-BFGS's
  continuation, run where the interior point does not improve on `res`."""
  m, n = C.shape
  if not certain and (int(res.status) == optim.CONVERGED or not float(res.row_error) > (
      _KINK_MISSING_MASS)):
    return res
  work = m * n * n
  dense_affordable = work <= _INTERIOR_POINT_MAX_WORK
  if work <= _DENSE_INTERIOR_POINT_WORK or (n ** 3 > _INTERIOR_POINT_MAX_WORK
                                            and dense_affordable):
    exact = ipm.solve_positive(a, b, C, reg)
  else:
    exact = ipm.solve_on_candidates(a, b, C, reg, res.alpha)
    if int(exact.status) != optim.CONVERGED and dense_affordable:
      # A support the barrier could not finish on (its bounds apart, or a
      # candidate pattern with no plan meeting the marginals).
      exact = ipm.solve_positive(a, b, C, reg)
  if not float(exact.value) > float(res.value):   # NaN included
    return res if resume is None else _chain(res, resume(res.alpha))
  steps = int(res.num_iter) + int(exact.num_iter)
  evals = int(res.num_evals) + int(exact.num_evals)
  return exact._replace(num_iter=jnp.asarray(steps, jnp.int32),
                        num_evals=jnp.asarray(evals, jnp.int32), trace=res.trace,
                        status=jnp.asarray(optim.INTERIOR_POINT, jnp.int32))


def _chain(first: OTResult, second: OTResult) -> OTResult:
  """`second`, an L-BFGS run resumed from `first`'s alpha, with both runs'
  counts and traces joined (the second's evaluation counts shifted)."""
  trace = None
  if first.trace is not None:
    shifted = second.trace._replace(num_evals=second.trace.num_evals + first.num_evals)
    trace = jax.tree_util.tree_map(lambda x, y: jnp.concatenate([x, y]), first.trace, shifted)
  return second._replace(num_iter=first.num_iter + second.num_iter,
                         num_evals=first.num_evals + second.num_evals, trace=trace)


def _solve(a, b, C, reg, alpha0, beta0, *, formulation, solver: Union[LBFGS, Adam], max_iter,
           tol, trace, result=True) -> OTResult:
  """The solver's program (`_solve_program`) for these options.

  The numeric options (max_iter, tol and the solver object's tolerances and
  step size) are passed to it as values, not compiled in: a problem solved
  again with other tolerances or budgets (L-BFGS's 200 iterations and then
  the rest of its budget at a certain kink, a sweep over tol) reuses one
  compiled program. Only what shapes the program is static: the
  formulation, the method, L-BFGS's history size, Adam's fixed-length loop
  (tol == 0) and, with trace=True, max_iter (the trace's length).
  """
  numeric = dict(max_iter=max_iter, tol=tol)
  if isinstance(solver, LBFGS):
    numeric.update(ftol=solver.ftol, patience=solver.patience, rtol=solver.rtol)
    name, history = "lbfgs", solver.history
  else:
    numeric.update(learning_rate=solver.learning_rate)
    name, history = "adam", None
  return _solve_program(a, b, C, reg, alpha0, beta0, numeric, formulation=formulation,
                        solver=name, history=history, fixed_iter=name == "adam" and tol == 0,
                        trace_len=max_iter if trace else 0, result=result)


@functools.partial(jax.jit, static_argnames=(
    "formulation", "solver", "history", "fixed_iter", "trace_len", "result"))
def _solve_program(a, b, C, reg, alpha0, beta0, numeric, *, formulation, solver, history,
                   fixed_iter, trace_len, result) -> OTResult:
  """The solver's program. numeric: the options of `_solve` as scalars
  (max_iter, tol, and learning_rate for "adam", else ftol, patience, rtol);
  trace_len: max_iter with trace=True, else 0. result=False (semi-dual
  only): plan, value, beta and duality_gap are left None for `semi_dual_at`
  to fill in."""
  trace = trace_len > 0
  max_iter = trace_len if trace else numeric["max_iter"]
  tol = numeric["tol"]
  m, n = C.shape
  # L-BFGS solves C / s with gamma / s (the same plan; potentials and values
  # in units of s), s a power of two (exact) near the costs' typical gap where
  # that is extreme (`_cost_scale`). Adam is left as it is: its learning rate is a
  # step in the caller's units.
  s = _cost_scale(C) if solver == "lbfgs" else jnp.ones((), C.dtype)
  C = C / s
  reg = jax.tree_util.tree_map(lambda g: g / s, reg)
  if alpha0 is not None:
    alpha0 = alpha0 / s
    beta0 = None if beta0 is None else beta0 / s   # (semi-dual: unused)
  if alpha0 is None:
    # The dual keeps alpha = beta = 0: from the c-transform start its L-BFGS
    # stalled at kinks sooner (one test problem: 1.8e-5 short instead of 6e-9).
    alpha0 = c_transform_start(b, C, reg) if formulation == "semi_dual" else jnp.zeros_like(a)
    beta0 = jnp.zeros_like(b)
  mass = jnp.sum(a)
  # The masses may differ within the dtype's tolerance (`validation.mass_rtol`:
  # up to 16 eps in half precision, 12% in bfloat16). The dual and semi-dual
  # are then unbounded (alpha + c moves the value by c (sum(a) - sum(b))), and
  # a solve drifts along alpha + c until it stalls far from the plan: b is
  # rescaled to a's mass. With equal masses the factor is 1 up to rounding (a
  # 1-ulp change of b, which can move where a kink-bound solve stops).
  b = results.matched_mass(b, a)
  # Zero-mass rows (and, for the dual, columns): their potentials are parked
  # below every threshold (`_park`), only when there are some.
  dead_rows = jnp.any(a <= 0)
  if formulation == "semi_dual":
    def park(x):
      return lax.cond(dead_rows, lambda x: _park_semi_dual(x, a, b, C, reg), lambda x: x, x)

    # Transposed once, before the solver's loop (see semi_dual_value_and_grad).
    C_t = C.T

    def fun(x):
      return objectives.semi_dual_value_and_grad(park(x), a, b, C, reg, C_t)
    x0 = alpha0
  else:
    dead_cols = jnp.any(b <= 0)

    def park(x):
      def both(x):
        return jnp.concatenate(_park_dual(x[:m], x[m:], a, b, C, reg))
      return lax.cond(dead_rows | dead_cols, both, lambda x: x, x)

    def fun(x):
      x = park(x)
      value, (ga, gb), T = objectives.dual_value_and_grad(x[:m], x[m:], a, b, C, reg)
      return value, jnp.concatenate([ga, gb]), T
    x0 = jnp.concatenate([alpha0, beta0])

  if solver == "adam":
    st = optim.adam(fun, x0, max_iter=max_iter, tol=tol, learning_rate=numeric["learning_rate"],
                    trace=trace, tol_scale=mass, fixed_iter=fixed_iter)
  else:
    # Marginals of extreme total mass: L-BFGS on the objective per unit of mass,
    # so that its first step length and its curvature tests (absolute epsilons)
    # behave as at mass ~1 (tested at 1e-20 and 1e3). Masses in [1/256, 256]
    # are left as they are.
    unit = jnp.where((mass < 2.0 ** -8) | (mass > 2.0 ** 8), mass, 1.0)

    def per_unit(x):
      value, g, T = fun(x)
      return value / unit, g / unit, T
    gate = _objective_gate(reg, m, formulation)
    st = optim.lbfgs(per_unit, x0, max_iter=max_iter, tol=tol, history=history,
                     ftol=numeric["ftol"], patience=numeric["patience"], rtol=numeric["rtol"],
                     trace=trace, tol_scale=mass / unit,
                     objective_gate=None if gate is None else gate * mass / unit)
    # Values back in the caller's units (gradients, the marginals, have none).
    st = st._replace(value=st.value * (unit * s), grad=st.grad * unit,
                     grad_norm=st.grad_norm * unit,
                     trace=None if st.trace is None else st.trace._replace(
                         value=st.trace.value * (unit * s),
                         grad_norm=st.trace.grad_norm * unit))
  x = park(st.x)
  converged = (st.status == optim.CONVERGED) | (st.status == optim.OBJECTIVE_TOL)
  if formulation == "semi_dual":
    alpha = x
    if not result:
      return OTResult(plan=None, value=None, alpha=alpha * s, beta=None, num_iter=st.num_iter,
                      grad_norm=st.grad_norm, converged=converged, duality_gap=None,
                      num_evals=st.num_evals, trace=st.trace, status=st.status)
    value, T, beta, primal = results.semi_dual_result(alpha, a, b, C_t, reg)
    value = value * s
  else:
    alpha, beta = x[:m], x[m:]
    T = objectives.plan_from_dual(alpha, beta, C, reg)
    value = st.value
    primal = jnp.sum(T * C) + results.plan_primal(reg, T)
  row_error, col_error, feasible = results.plan_errors(T, a, b)
  # A stop rule can fire on a plan that misses the marginals: the objective
  # rule at a kink, or any rule where gamma is below what the dtype resolves
  # against C (C 1e30 times [0, 1) with gamma 0.1: u = (alpha - c) / gamma
  # spans 1e31, and the plan rounds to zero). converged needs the plan too.
  converged = converged & feasible
  return OTResult(plan=T, value=value, alpha=alpha * s, beta=beta * s, num_iter=st.num_iter,
                  grad_norm=st.grad_norm, converged=converged,
                  duality_gap=primal * s - value, num_evals=st.num_evals, trace=st.trace,
                  status=st.status, row_error=row_error, col_error=col_error,
                  plan_feasible=feasible)


def _objective_gate(reg, m: int, formulation: str) -> Optional[float]:
  """The L1 marginal error, relative to the mass, below which L-BFGS's
  objective rules may stop it (`optim.lbfgs`, objective_gate): where the
  problem is smooth, a plan that `plan_feasible` accepts (both marginals
  within PLAN_FEASIBLE_RTOL: their sum within twice that for the dual, whose
  gradient holds both); None (no gate) where k may bind, as a plan at a kink
  may never meet its marginals. Smooth: every regularizer but
  SparsityConstrained with k < m."""
  if isinstance(reg, SparsityConstrained) and reg.k < m:
    return None
  return PLAN_FEASIBLE_RTOL * (2.0 if formulation == "dual" else 1.0)


# `_cost_scale`: costs whose typical gap (below) lies within [2^-20, 2^20]
# are solved as they are. L-BFGS's first step and its curvature test are
# absolute (a unit step; |y| above rounding of |g|), so far outside the band
# it stops at its first iteration (docs/OT.md, "How `ot.solve` decides").
# Inside the band nothing changes (s = 1), so tuned results stay as they were.
_COST_SCALE_BAND = 2.0 ** 20


def _cost_scale(C):
  """s: 1, or the power of two just above the costs' typical gap where that
  lies outside [2^-20, 2^20]: the median over rows of the difference between
  a row's two smallest costs (how far a potential moves to shift a row's
  mass to its next column). Not max C - min C: a few sentinel costs (1e30
  for forbidden pairs among O(1) ones, which L-BFGS solves as they are) would
  set it. C / s and gamma / s give the same plan, with potentials and values
  divided by s: every regularizer is gamma times a function of the plan.
  C: (m, n); returns a scalar in C's dtype."""
  if C.shape[1] < 2:
    return jnp.ones((), C.dtype)
  two = -lax.top_k(-C, 2)[0]   # each row's two smallest costs
  gap = jnp.median(two[:, 1] - two[:, 0])
  extreme = jnp.isfinite(gap) & (gap > 0) & (
      (gap < 1 / _COST_SCALE_BAND) | (gap > _COST_SCALE_BAND))
  _, exponent = jnp.frexp(jnp.where(extreme, gap, 1))
  return jnp.where(extreme, jnp.ldexp(jnp.ones((), C.dtype), exponent), 1).astype(C.dtype)


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
