"""What a solve returns, and the semi-dual scored at given potentials.

`OTResult` and the pieces that fill it (marginal errors, the primal value of a
plan, the k-sparse feasibility check, the semi-dual's value and plan at alpha)
are shared by `solvers.solve` and `interior_point`, so they live below both:
`solve` finishes kink-bound runs with the interior point, and the interior
point reports its result the way `solve` does.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from vmoe_sparse_ot.ot import optim
from vmoe_sparse_ot.ot import validation
from vmoe_sparse_ot.ot.regularizers import Regularizer, SparsityConstrained

Array = jax.Array


class OTResult(NamedTuple):
  """Result of `solve` (a pytree; every field gains a leading axis under vmap).

  plan: (m, n) transport plan recovered from the potentials (SparsityConstrained:
    at most k nonzeros per column). A coupling of a and b only where
    `plan_feasible`: where k binds the optimum is a kink of the semi-dual and
    its k-sparse plan may leave rows short (see `primal_plan`). Status
    "interior_point": `primal_plan` instead where the potentials' plan is no
    coupling and primal_plan has at most k nonzeros per column (then it is
    the sparsity-constrained optimum).
  value: the dual / semi-dual objective at the returned potentials.
  alpha: (m,) potential of the rows.
  beta: (n,) potential of the columns; for the semi-dual, beta_j = dS/db_j (the
    potential that makes the semi-dual plan the dual one).
  num_iter: solver iterations run.
  grad_norm: max |gradient| of the objective at the potentials = the largest
    marginal violation of the plan recovered from them.
  converged: a stop rule fired (grad_norm <= tol * sum(a), or (L-BFGS) the
    objective rule, see `solve`; status "interior_point": the optimum
    certified to duality_gap) *and* `plan` meets the marginals
    (plan_feasible). False after max_iter, a stall, with tol == 0, and
    wherever the plan misses the marginals, whatever rule fired: at a kink
    whose optimum has no k-sparse coupling (`status` then still says the
    value converged: "objective_tol", "interior_point"; see
    `reason(full=True)`), or where gamma is too small against the costs'
    spread for the dtype to resolve a plan (C 1e30 times [0, 1) with gamma
    0.1 in float32: u = (alpha - c) / gamma spans 1e31).
  duality_gap: P(plan) - value, P the convex primal <T, C> + sum_j Omega**(t_j)
    (gamma Psi for SparsityConstrained). Not a certificate unless the marginals
    hold, i.e. grad_norm is small. Status "interior_point": P(primal_plan) -
    value, a certificate (primal_plan is a coupling).
  num_evals: objective evaluations (line-search trials included).
  trace: `OTTrace` of per-iteration value, gradient norm and evaluation count
    when solved with trace=True; None otherwise.
  status: int32, why the solver stopped: an index into `ot.STATUS` =
    ("converged", "objective_tol", "max_iter", "stalled", "fixed_iter",
    "interior_point"); `result.reason()` gives the name (concrete results only).
  row_error, col_error: sum_i |(plan 1)_i - a_i| / sum(a) and sum_j |(plan^T
    1)_j - b_j| / sum(a): the L1 marginal errors of `plan`, relative to the
    mass (b rescaled to sum(a)); 0 for a coupling.
  plan_feasible: bool, row_error and col_error <= `PLAN_FEASIBLE_RTOL` (1e-3,
    0.1% of the mass). A value stop ("objective_tol", "interior_point") with
    plan_feasible False: the value is (certified, for "interior_point") the
    optimum but `plan` is not a coupling -- a binding k's kink, or n k < m
    where no k-sparse coupling exists -- and converged is False.
  primal_plan: status "interior_point" (and `solve_interior_point`): (m, n) a
    coupling of a and b (marginals to rounding) that attains value +
    duality_gap in the convex primal P_Psi: the barrier's plan with its
    mu-sized entries (below 1e-4 to 1e-8 of min(a_i, b_j)) dropped where that
    does not raise P_Psi, else that plan rounded onto the marginals whole
    (every entry positive). P_Psi is the convex
    relaxation of the sparsity constraint, so its columns may hold more than
    k nonzeros where the k-sparse plan is infeasible; where none does it also
    solves the sparsity-constrained problem itself. None otherwise (L-BFGS,
    Adam, under jit / vmap).
  primal_nnz_per_column: (n,) int32, the nonzeros of each column of primal_plan;
    None where primal_plan is.
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
  status: Array = None
  row_error: Array = None
  col_error: Array = None
  plan_feasible: Array = None
  primal_plan: Array | None = None
  primal_nnz_per_column: Array | None = None

  def reason(self, full: bool = False) -> str:
    """The stop reason's name (see `status`); for a concrete, unbatched result.

    full=True: one line that also says what the result certifies, e.g.
    "interior_point: value certified (duality_gap 3e-12 of it); plan infeasible
    (row_error 0.25, col_error 0); primal_plan is a coupling (nonzeros per
    column [4, 2, 3])".
    """
    status = int(self.status)
    name = optim.STATUS[status]
    if not full or self.row_error is None:
      return name
    # About the value, from the status (converged also needs the plan).
    gap = float(self.duality_gap) / max(abs(float(self.value)), np.finfo(float).tiny)
    if status == optim.INTERIOR_POINT or (status == optim.CONVERGED
                                          and self.primal_plan is not None):
      certified = status == optim.CONVERGED or gap <= CERTIFIED_RTOL
      value = (f"value certified (duality_gap {gap:.1g} of it)" if certified
               else f"value not certified (duality_gap {gap:.1g} of it)")
    elif status in (optim.CONVERGED, optim.OBJECTIVE_TOL):
      value = "value converged"
    else:
      value = "value not converged"
    errors = f"(row_error {float(self.row_error):.2g}, col_error {float(self.col_error):.2g})"
    plan = ("plan feasible " if bool(self.plan_feasible) else "plan infeasible ") + errors
    text = f"{name}: {value}; {plan}"
    if self.primal_plan is not None:
      nnz = [int(x) for x in np.asarray(self.primal_nnz_per_column)]
      text += f"; primal_plan is a coupling (nonzeros per column {nnz})"
    return text


# The interior point's bounds agree to this (relative to the value) when it
# certifies the optimum (`interior_point._GAP_RTOL`).
CERTIFIED_RTOL = 1e-6

# `OTResult.plan_feasible`: the plan's L1 marginal errors relative to the mass
# are at most this. Smooth problems' L-BFGS stops (objective rule) left up to
# 6e-4 (dual, 200 x 10) on the tests' problems, kink stops 3e-3 and more; the
# same level marks a kink stop for `solve`'s switch (`solvers._KINK_MISSING_MASS`).
PLAN_FEASIBLE_RTOL = 1e-3


def plan_errors(T, a, b, xp=jnp):
  """(row_error, col_error, plan_feasible) of plan T for marginals a, b (b
  already matched to a's mass); xp: jnp in the jitted program, np on the host
  (eager jnp ops would each compile a small program)."""
  mass = xp.sum(a)
  row = xp.sum(xp.abs(xp.sum(T, 1) - a)) / mass
  col = xp.sum(xp.abs(xp.sum(T, 0) - b)) / mass
  return row, col, (row <= PLAN_FEASIBLE_RTOL) & (col <= PLAN_FEASIBLE_RTOL)


class KSparseInfeasibleWarning(UserWarning):
  """`solve` with SparsityConstrained(k) where n k < m: no coupling has at most
  k nonzeros per column, so the k-sparse plan cannot meet the row marginals."""


INFEASIBLE = ("warn", "raise", "ignore")


def check_k_sparse_feasible(a, C, reg: Regularizer, infeasible: str, stacklevel: int = 3):
  """Warns (infeasible="warn"), raises ValueError ("raise") or does nothing
  ("ignore") where reg is SparsityConstrained and its plans cannot be
  couplings: n k < the rows with mass (every row of a traced a counts). Each
  row with mass needs a nonzero and the columns hold at most n k of them."""
  validation.check_choice("infeasible", infeasible, INFEASIBLE)
  if infeasible == "ignore" or not isinstance(reg, SparsityConstrained):
    return
  m, n = C.shape
  rows = int(np.count_nonzero(np.asarray(a) > 0)) if validation.is_concrete(a) else m
  if n * reg.k >= rows:
    return
  rows_text = f"m = {m} rows" if rows == m else f"{rows} rows with mass (m = {m})"
  message = (f"no k-sparse coupling exists: n k = {n} x {reg.k} = {n * reg.k} < {rows_text}; "
             "the plan cannot meet the row marginals (see OTResult.row_error, "
             "plan_feasible, primal_plan)")
  if infeasible == "raise":
    raise ValueError(f"infeasible='raise': {message}")
  warnings.warn(message, KSparseInfeasibleWarning, stacklevel=stacklevel)



def plan_primal(reg: Regularizer, T: Array) -> Array:
  """sum_j Omega**(t_j) for a plan from the solvers (columns have <= k nonzeros).

  For such columns Psi(t) = 1/2 ||t||^2 exactly (lambda = 1 on the support), so no
  sort is needed.
  """
  if isinstance(reg, SparsityConstrained):
    return 0.5 * reg.gamma * jnp.sum(T * T)
  return jnp.sum(reg.primal(T, axis=0))



def host_plan_errors(T, a, b):
  """`plan_errors` of concrete arrays on the host, as dtype arrays."""
  a, b, T = np.asarray(a), np.asarray(b), np.asarray(T)
  row, col, feasible = plan_errors(T, a, b * (a.sum() / b.sum()), xp=np)
  return jnp.asarray(row, T.dtype), jnp.asarray(col, T.dtype), jnp.asarray(feasible)



def matched_mass(b, a):
  """b rescaled to sum(a): masses that differ within tolerance make the dual and
  semi-dual unbounded (see `solvers._solve`)."""
  b_mass = jnp.sum(b)
  return jnp.where(b_mass > 0, b * (jnp.sum(a) / b_mass), b)


def semi_dual_result(alpha, a, b, C_t, reg: Regularizer):
  """(S(alpha), its plan T (m, n), beta = dS/db, the primal value of T), b
  already matched to a's mass. The plan is formed in the (n, m) layout, where
  dense columns are evaluated (compact ones give the same plan in either)."""
  vals, T_t, dval_db = reg.conj_simplex(alpha[None, :] - C_t, b, axis=1)
  T = T_t.T
  return (jnp.dot(alpha, a) - jnp.sum(vals), T, -dval_db,
          jnp.sum(T_t * C_t) + plan_primal(reg, T))


@jax.jit
def semi_dual_at(alpha, a, b, C, reg: Regularizer):
  """`solve`'s semi-dual result at alpha, jitted on its own for the interior
  point, which scores its multipliers with it, and for `solve` where the
  interior point may follow. Elsewhere `solve` computes the same inside its
  own program: a separate call costs a first call one more compilation."""
  return semi_dual_result(alpha, a, matched_mass(b, a), C.T, reg)
