"""Sparse optimal transport in pure JAX (no Flax).

The dual and semi-dual framework of "Sparsity-Constrained Optimal Transport"
(Liu, Puigcerver, Blondel, ICLR 2023): OT with squared-L2 regularization and at
most k nonzeros per column of the plan, solved through its dual or semi-dual with
L-BFGS or Adam; `solve_interior_point`, a barrier method on the primal for the
problems whose optimum is a kink of the semi-dual (k binds; `solve` switches to it
itself where L-BFGS stops there); the squared-L2 and entropic baselines and
log-domain Sinkhorn; and `batched_semi_dual`, many small semi-duals at once
(the MoE router's problems), by damped semi-smooth Newton in at most 10 steps
(`batched_semi_dual_newton`) or by the paper's Adam through one of its paths:
`batched_semi_dual_adam`, `batched_semi_dual_adam_candidates` (each step's
selection on a few candidate rows per column) and
`batched_semi_dual_adam_pallas` (one fused Pallas kernel per problem: Triton on
a GPU; interpret mode, for tests, on the CPU).

    from vmoe_sparse_ot import ot
    res = ot.solve(a, b, C, ot.SparsityConstrained(k=2, gamma=1.0))
    res.plan, res.value, res.duality_gap

Everything runs under `jax.jit` and `jax.vmap` (the switch to the interior point
only eagerly); see docs/ARCHITECTURE.md. Every array map differentiates in both
modes; the solvers that stop on data-dependent tests say so in one line when
differentiated. float16 / bfloat16 inputs are computed in float32
(`ot.precision`). docs/OT.md has the details.
"""
from vmoe_sparse_ot.ot.batched import batched_semi_dual_adam
from vmoe_sparse_ot.ot.batched_solve import BatchedSemiDualResult, batched_semi_dual
from vmoe_sparse_ot.ot.candidates import batched_semi_dual_adam_candidates
from vmoe_sparse_ot.ot.interior_point import solve_interior_point
from vmoe_sparse_ot.ot.newton import NewtonResult, batched_semi_dual_newton
from vmoe_sparse_ot.ot.ksupport import squared_k_support_norm
from vmoe_sparse_ot.ot.objectives import (
    dual_objective,
    dual_value_and_grad,
    marginal_errors,
    plan_from_dual,
    plan_from_semi_dual,
    primal_objective,
    semi_dual_objective,
    semi_dual_value_and_grad,
)
from vmoe_sparse_ot.ot.optim import STATUS, OTTrace
from vmoe_sparse_ot.ot.pallas_solve import batched_semi_dual_adam_pallas
from vmoe_sparse_ot.ot.projections import (
    projection_nonneg,
    projection_simplex,
    projection_sparse_nonneg,
    projection_sparse_simplex,
    simplex_threshold,
)
from vmoe_sparse_ot.ot.regularizers import (
    NegEntropy,
    Regularizer,
    SparsityConstrained,
    SquaredL2,
)
from vmoe_sparse_ot.ot.selection import threshold_top_k_mask, top_k, top_k_mask, uses_radix
from vmoe_sparse_ot.ot.results import PLAN_FEASIBLE_RTOL, KSparseInfeasibleWarning, OTResult
from vmoe_sparse_ot.ot.sinkhorn import SinkhornResult, sinkhorn
from vmoe_sparse_ot.ot.solver_options import LBFGS, Adam
from vmoe_sparse_ot.ot.solvers import c_transform_start, semi_dual_loss, solve

__all__ = [
    "LBFGS",
    "PLAN_FEASIBLE_RTOL",
    "Adam",
    "KSparseInfeasibleWarning",
    "NegEntropy",
    "OTResult",
    "OTTrace",
    "STATUS",
    "Regularizer",
    "SinkhornResult",
    "SparsityConstrained",
    "SquaredL2",
    "BatchedSemiDualResult",
    "NewtonResult",
    "batched_semi_dual",
    "batched_semi_dual_adam",
    "batched_semi_dual_adam_candidates",
    "batched_semi_dual_adam_pallas",
    "batched_semi_dual_newton",
    "c_transform_start",
    "dual_objective",
    "dual_value_and_grad",
    "marginal_errors",
    "plan_from_dual",
    "plan_from_semi_dual",
    "primal_objective",
    "projection_nonneg",
    "projection_simplex",
    "projection_sparse_nonneg",
    "projection_sparse_simplex",
    "semi_dual_loss",
    "semi_dual_objective",
    "semi_dual_value_and_grad",
    "simplex_threshold",
    "sinkhorn",
    "solve",
    "solve_interior_point",
    "squared_k_support_norm",
    "top_k",
    "threshold_top_k_mask",
    "top_k_mask",
    "uses_radix",
]
