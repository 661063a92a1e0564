"""'sparse_ot': the paper's router (Section 6.2; Appendix A.5, "The Sparsity-constrained router").

Sparsity-constrained OT per group with cost -softmax(logits), mass 1 per token
and S/E per expert, at most k nonzeros per expert column (the paper's
column-k-sparse problem), approximated through its semi-dual (Sections 4 and 5) with
Adam (learning rate 1e-2, 50 steps in the paper) or L-BFGS. Each expert takes
the tokens in the support of its column, so it never receives more than k; its
buffer has C = k slots. Form 'token_choice' transposes the problem: at most K
experts per token, slots as in TopK. Combine weights are softmax(logits) at the
dispatched pairs; no gradient flows through the solver.
"""
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array
# Cost of padding tokens: far above any real token's (costs are in [0, 1]), so
# padding never enters a column's top k.
_PAD_COST = 100.0


@dataclasses.dataclass(frozen=True)
class SparseOTOptions(base.CommonOptions):
  form: str = base.option(
      "expert_choice", "'expert_choice': at most k tokens per expert (the paper's form); "
      "'token_choice': at most K experts per token.", choices=("expert_choice", "token_choice"))
  k: Optional[int] = base.option(
      None, "Nonzeros per expert column (expert_choice form), also the buffer size C; "
      "None: C from capacity_factor / capacity.", check=base.AT_LEAST_ONE)
  solver: str = base.option("adam", "Semi-dual solver.", choices=("adam", "lbfgs"))
  num_steps: int = base.option(50, "Solver steps (fixed, no tolerance).",
                               check=base.AT_LEAST_ONE)
  learning_rate: float = base.option(1e-2, "Adam step size.", check=base.POSITIVE)
  gamma: float = base.option(1.0, "Squared-L2 regularization strength.", check=base.POSITIVE)
  implementation: str = base.option(
      "fast", "'fast': the router's batched Adam (same iterates as ot.solve, faster); "
      "'candidates': the same Adam steps, each on 2k candidate rows per expert with the "
      "k-th value found from the previous step's, checked against all tokens every step "
      "(same plans up to rounding; faster than 'fast' at the B/32 router shapes on CPU, "
      "see benchmarks/RESULTS.md); 'reference': jax.vmap(ot.solve). L-BFGS always uses "
      "ot.solve.",
      choices=("fast", "candidates", "reference"))


def capacity(opts: SparseOTOptions, group_size: int, num_experts: int) -> int:
  if opts.form == "expert_choice" and opts.k is not None:
    return min(opts.k, group_size)
  return base.default_capacity(opts, group_size, num_experts)


def _solve_plans(cost: Array, a: Array, b: Array, k: int, opts: SparseOTOptions) -> Array:
  """(G, m, n) plans of G semi-duals, <= k nonzeros per column."""
  if opts.solver == "adam" and opts.implementation == "fast":
    return ot.batched_semi_dual_adam(cost, a, b, k, opts.gamma, opts.num_steps,
                                     opts.learning_rate)
  if opts.solver == "adam" and opts.implementation == "candidates":
    return ot.batched_semi_dual_adam_candidates(cost, a, b, k, opts.gamma, opts.num_steps,
                                                opts.learning_rate)
  # From alpha = 0 like the fast path (not `ot.solve`'s c-transform start).
  # infeasible="ignore": with E C < S tokens the router drops tokens by design.
  kwargs = {"max_iter": opts.num_steps, "tol": 0.0, "init": jnp.zeros_like(a[0]),
            "infeasible": "ignore"}
  if opts.solver == "adam":
    kwargs["learning_rate"] = opts.learning_rate
  reg = ot.SparsityConstrained(k=k, gamma=opts.gamma)
  return jax.vmap(lambda c, a, b: ot.solve(a, b, c, reg, formulation="semi_dual",
                                           solver=opts.solver, **kwargs).plan)(cost, a, b)


def plans(logits: Array, token_mask: Array, opts: SparseOTOptions, capacity: int) -> Array:
  """The router's plans (G, S, E) (no gradient).

  Expert-choice form: at most k = C nonzeros per expert column; token-choice
  form: at most K nonzeros per token row (the transposed problem). Cost
  1 - softmax: the paper's -softmax shifted by a constant (same plans, and
  non-negative as the OT library asks). Padding tokens get no mass.
  """
  e = logits.shape[-1]
  gates = jax.nn.softmax(jax.lax.stop_gradient(logits).astype(jnp.float32), axis=-1)
  mask = token_mask.astype(jnp.float32)
  cost = jnp.where(token_mask[..., None], 1.0 - gates, _PAD_COST)        # (G, S, E)
  a = mask                                                               # (G, S)
  b = jnp.broadcast_to(jnp.sum(mask, axis=1, keepdims=True) / e, mask.shape[:1] + (e,))
  if opts.form == "expert_choice":
    return _solve_plans(cost, a, b, capacity, opts)
  # Rows are experts (mass S/E), columns tokens (mass 1), <= K nonzeros per token.
  k = min(opts.num_selected_experts, e)
  return jnp.swapaxes(_solve_plans(jnp.swapaxes(cost, 1, 2), b, a, k, opts), 1, 2)


def route(logits: Array, token_mask: Array, opts: SparseOTOptions, capacity: int, train: bool,
          rng: Optional[Array]) -> rt.Routing:
  del train, rng
  e = logits.shape[-1]
  plan = plans(logits, token_mask, opts, capacity)
  if opts.form == "expert_choice":
    token_index, valid = rt.assign_expert_choice(plan, token_mask, capacity, min_score=0.0)
  else:
    k = min(opts.num_selected_experts, e)
    token_index, valid = base.assign_top_k(plan, token_mask, e, k, capacity,
                                           opts.batch_priority, choice_mask_positive=True)
  gates = jax.nn.softmax(logits, axis=-1)
  return base.finish(gates, token_index, valid, base.zero_loss())


ROUTER = base.Router(name="sparse_ot", options=SparseOTOptions, route=route, capacity=capacity)
