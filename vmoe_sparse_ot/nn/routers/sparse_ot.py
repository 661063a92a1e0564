"""'sparse_ot': the paper's router (Section 6.2; Appendix A.5, "The Sparsity-constrained router").

Sparsity-constrained OT per group with cost -softmax(logits), mass 1 per token
and S/E per expert, at most k nonzeros per expert column (the paper's
column-k-sparse problem), approximated through its semi-dual (Sections 4 and 5) by
damped semi-smooth Newton in at most 10 steps (the default, `ot.batched_semi_dual`;
as good a semi-dual gap and row-mass error as the paper's solver on its B/32
problems), Adam (learning rate 1e-2, 50 steps: the paper's setting,
solver='adam') or L-BFGS. Each expert takes
the tokens in the support of its column, so it never receives more than k; its
buffer has C = k slots. Form 'token_choice' transposes the problem: at most K
experts per token, slots as in TopK. Combine weights are softmax(logits) at the
dispatched pairs, or with `combine_weights='plan'` the plan's entries there; no
gradient flows through the solver, nor through the plan (as the reference's
k-sparse routers, whose k-sparse projection is cut from the gradient: with plan
combine weights the router layer learns nothing). `dispatch_zeros` fills the
buffers as the reference's dispatchers do (see the option). Per layer the router
reports the solver's steps (`solver_steps`, the mean over groups, and
`solver_steps_max`) and the fraction of groups that reached the cap without
meeting the solver's stop rule (`solver_unconverged`; Adam and L-BFGS run a fixed
count: 0).
"""
import dataclasses
import functools
import warnings
from typing import Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn import sharding
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array
# Cost of padding tokens: far above any real token's (costs are in [0, 1]), so
# padding never enters a column's top k.
_PAD_COST = 100.0
COMBINE_WEIGHTS = ("softmax", "plan")


@dataclasses.dataclass(frozen=True)
class SparseOTOptions(base.CommonOptions):
  form: str = base.option(
      "expert_choice", "'expert_choice': at most k tokens per expert (the paper's form); "
      "'token_choice': at most K experts per token.", choices=("expert_choice", "token_choice"))
  k: Optional[int] = base.option(
      None, "Nonzeros per expert column (expert_choice form), also the buffer size C; "
      "None: C from capacity_factor / capacity.", check=base.AT_LEAST_ONE)
  solver: str = base.option(
      "newton", "Semi-dual solver: 'newton' (damped semi-smooth Newton, at most num_steps "
      "gradient evaluations per group, stopping on its own rule: ot.batched_semi_dual); "
      "'adam' (the paper's: num_steps Adam steps at learning_rate); 'lbfgs' (ot.solve, "
      "num_steps iterations).", choices=("newton", "adam", "lbfgs"))
  num_steps: Optional[int] = base.option(
      None, "Solver steps: Newton's cap, Adam's or L-BFGS's fixed count. None: the "
      "solver's default, 10 for 'newton', the paper's 50 for 'adam' and 'lbfgs'.",
      check=base.AT_LEAST_ONE)
  tol: float = base.option(
      ot.newton.DEFAULT_TOL, "Newton's stop rule: the Newton model's gain at most tol times sum(a) times "
      "the costs' scale (ot.newton); 0 runs num_steps.", check=base.NON_NEGATIVE)
  learning_rate: float = base.option(1e-2, "Adam step size.", check=base.POSITIVE)
  gamma: float = base.option(1.0, "Squared-L2 regularization strength.", check=base.POSITIVE)
  implementation: str = base.option(
      "auto", "Adam's path (solver='adam'; Newton has one). "
      "'auto': the faster of 'fast' and 'candidates' for the routing shapes and "
      "backend (`picked_implementation`; the rule measured in benchmarks/RESULTS.md); "
      "'fast': the router's batched Adam (same iterates as ot.solve, faster); "
      "'candidates': the same Adam steps, each on 2k candidate rows per expert with the "
      "k-th value found from the previous step's, checked against all tokens every step "
      "(same plans up to rounding; faster than 'fast' at the B/32 router shapes on CPU, "
      "see benchmarks/RESULTS.md); 'pallas': the same Adam steps as 'fast' in one fused "
      "Pallas kernel per group (ot.pallas_solve; same plans up to rounding), the group's "
      "block on chip for all its steps: Triton on a GPU (opt-in: 'auto' does not pick it; "
      "its timings are in benchmarks/RESULTS.md); on the CPU it runs in Pallas "
      "interpret mode, for tests only (slow; warns once); 'reference': "
      "jax.vmap(ot.solve). L-BFGS always uses "
      "ot.solve. Not compared when a checkpoint resumes (train.run_record."
      "ROUTER_COMPUTE_KEYS): workdirs from before 'auto' (the default then: 'fast') "
      "resume under it; set 'fast' to continue them bit-identically.",
      choices=("auto", "fast", "candidates", "reference", "pallas"))
  combine_weights: str = base.option(
      "softmax", "Combine weights at the dispatched pairs: 'softmax' (of the logits) or "
      "'plan' (the plan's entries, no gradient), as the reference's "
      "use_softmax_combine_weights True / False.", choices=COMBINE_WEIGHTS)
  dispatch_zeros: bool = base.option(
      False, "False: only pairs in the plan's support are dispatched. True: as the "
      "reference's dispatchers, each expert's top-C tokens (expert_choice) or each "
      "token's top-K experts (token_choice) by plan value take slots even where the plan "
      "is 0 (ties to the lower index).")


def capacity(opts: SparseOTOptions, group_size: int, num_experts: int) -> int:
  if opts.form == "expert_choice" and opts.k is not None:
    return min(opts.k, group_size)
  return base.default_capacity(opts, group_size, num_experts)


def picked_implementation(opts: SparseOTOptions, group_size: int, num_experts: int,
                          backend: Optional[str] = None) -> str:
  """The path `opts.implementation` runs at these routing shapes: itself, or for
  'auto' the one its rule picks (`ot.batched_solve.adam_path`); 'newton' wherever
  Newton solves, 'reference' wherever L-BFGS does."""
  if opts.solver == "newton":
    return "newton"
  if opts.solver != "adam":
    return "reference"
  if opts.implementation != "auto":
    return opts.implementation
  if opts.form == "expert_choice":
    m, n, k = group_size, num_experts, capacity(opts, group_size, num_experts)
  else:
    m, n, k = num_experts, group_size, min(opts.num_selected_experts, num_experts)
  return ot.batched_solve.adam_path(m, n, k, backend or jax.default_backend())


@functools.lru_cache(maxsize=None)
def _warn_interpret_once() -> None:
  warnings.warn("sparse_ot implementation='pallas' on the CPU runs the fused kernel in "
                "Pallas interpret mode, meant for tests: it is much slower than 'fast' "
                "(what implementation='auto' picks on the CPU).", stacklevel=3)


def num_steps(opts: SparseOTOptions) -> int:
  """The solver's step count (cap for Newton): opts.num_steps, or its default."""
  if opts.num_steps is not None:
    return opts.num_steps
  return ot.batched_solve.DEFAULT_STEPS["newton" if opts.solver == "newton" else "adam"]


def _solve(cost: Array, a: Array, b: Array, k: int, opts: SparseOTOptions):
  """(plans (G, m, n) with <= k nonzeros per column, steps (G,), converged (G,))."""
  g = cost.shape[0]
  steps = num_steps(opts)
  fixed = lambda plan: (plan, jnp.full((g,), steps, jnp.int32), jnp.ones((g,), bool))
  if opts.solver == "newton":
    res = ot.batched_semi_dual(cost, a, b, k, opts.gamma, solver="newton", max_steps=steps,
                               tol=opts.tol)
    return res.plan, res.steps, res.converged
  if opts.solver == "adam" and opts.implementation == "pallas":
    if jax.default_backend() == "cpu":
      _warn_interpret_once()
    # One custom call: split by hand over the devices that hold the groups, or XLA
    # gathers every group onto every device and solves them all there.
    return fixed(sharding.per_shard(
        lambda c, a, b: ot.batched_semi_dual_adam_pallas(c, a, b, k, opts.gamma, steps,
                                                         opts.learning_rate),
        cost, a, b))
  if opts.solver == "adam" and opts.implementation != "reference":
    res = ot.batched_semi_dual(cost, a, b, k, opts.gamma, solver="adam", max_steps=steps,
                               learning_rate=opts.learning_rate,
                               implementation=opts.implementation)
    return res.plan, res.steps, res.converged
  # From alpha = 0 like the batched paths (not `ot.solve`'s c-transform start).
  # infeasible="ignore": with E C < S tokens the router drops tokens by design.
  kwargs = {"max_iter": steps, "tol": 0.0, "init": jnp.zeros_like(a[0]),
            "infeasible": "ignore"}
  solver = ot.Adam(learning_rate=opts.learning_rate) if opts.solver == "adam" else opts.solver
  reg = ot.SparsityConstrained(k=k, gamma=opts.gamma)
  return fixed(jax.vmap(lambda c, a, b: ot.solve(a, b, c, reg, formulation="semi_dual",
                                                 solver=solver, **kwargs).plan)(cost, a, b))


def solve(logits: Array, token_mask: Array, opts: SparseOTOptions, capacity: int):
  """The router's plans (G, S, E) (no gradient), with the solver's steps (G,) and
  whether each group met its stop rule (G,).

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
    return _solve(cost, a, b, capacity, opts)
  # Rows are experts (mass S/E), columns tokens (mass 1), <= K nonzeros per token.
  k = min(opts.num_selected_experts, e)
  plan, steps, converged = _solve(jnp.swapaxes(cost, 1, 2), b, a, k, opts)
  return jnp.swapaxes(plan, 1, 2), steps, converged


def plans(logits: Array, token_mask: Array, opts: SparseOTOptions, capacity: int) -> Array:
  """The router's plans (G, S, E) alone (`solve`)."""
  return solve(logits, token_mask, opts, capacity)[0]


def route(logits: Array, token_mask: Array, opts: SparseOTOptions, capacity: int, train: bool,
          rng: Optional[Array]) -> rt.Routing:
  del train, rng
  e = logits.shape[-1]
  plan, steps, converged = solve(logits, token_mask, opts, capacity)
  min_score = None if opts.dispatch_zeros else 0.0
  if opts.form == "expert_choice":
    token_index, valid = rt.assign_expert_choice(plan, token_mask, capacity, min_score=min_score)
  else:
    k = min(opts.num_selected_experts, e)
    token_index, valid = base.assign_top_k(plan, token_mask, e, k, capacity,
                                           opts.batch_priority,
                                           choice_mask_positive=not opts.dispatch_zeros)
  gates = plan if opts.combine_weights == "plan" else jax.nn.softmax(logits, axis=-1)
  steps = steps.astype(jnp.float32)
  extra = {"solver_steps": jnp.mean(steps), "solver_steps_max": jnp.max(steps),
           "solver_unconverged": jnp.mean((~converged).astype(jnp.float32))}
  return base.finish(gates, token_index, valid, base.zero_loss(), extra)


def experts_per_token(opts: SparseOTOptions, num_experts: int) -> Optional[int]:
  """K for the token-choice form; None for the expert-choice form."""
  return base.top_k_per_token(opts, num_experts) if opts.form == "token_choice" else None


ROUTER = base.Router(name="sparse_ot", options=SparseOTOptions, route=route, capacity=capacity,
                     experts_per_token=experts_per_token)
