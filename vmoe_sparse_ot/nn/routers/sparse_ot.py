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
      "auto", "'auto': the faster of 'fast' and 'candidates' for the routing shapes and "
      "backend (`picked_implementation`; the rule measured in benchmarks/RESULTS.md); "
      "'fast': the router's batched Adam (same iterates as ot.solve, faster); "
      "'candidates': the same Adam steps, each on 2k candidate rows per expert with the "
      "k-th value found from the previous step's, checked against all tokens every step "
      "(same plans up to rounding; faster than 'fast' at the B/32 router shapes on CPU, "
      "see benchmarks/RESULTS.md); 'pallas': the same Adam steps as 'fast' in one fused "
      "Pallas kernel per group (ot.pallas_solve; same plans up to rounding), the group's "
      "block on chip for all its steps: Triton on a GPU (opt-in: 2.4x faster than 'fast' "
      "alone at the B/32 shapes on an H200, its train step not yet shown faster, so 'auto' "
      "does not pick it; see benchmarks/RESULTS.md); on the CPU it runs in Pallas "
      "interpret mode, for tests only (slow; warns once); 'reference': "
      "jax.vmap(ot.solve). L-BFGS always uses "
      "ot.solve. Not compared when a checkpoint resumes (nn.model_config."
      "ROUTER_COMPUTE_KEYS): workdirs from before 'auto' (the default then: 'fast') "
      "resume under it; set 'fast' to continue them bit-identically.",
      choices=("auto", "fast", "candidates", "reference", "pallas"))


def capacity(opts: SparseOTOptions, group_size: int, num_experts: int) -> int:
  if opts.form == "expert_choice" and opts.k is not None:
    return min(opts.k, group_size)
  return base.default_capacity(opts, group_size, num_experts)


def _auto(m: int, n: int, k: int, backend: str) -> str:
  """The Adam path 'auto' runs for problems of m rows and n columns, at most k
  nonzeros per column (expert choice: m = S tokens, n = E experts, k = C;
  token choice: m = E, n = S, k = K), on `backend`.

  CPU: the rule fits the router-alone grid of benchmarks/RESULTS.md ("sparse_ot's
  paths side by side", 2026-11-27, JAX 0.10.2, 6400 tokens per layer): it picks
  the faster path at all 25 of its shapes. 'candidates' wins where k is large
  (each step of 'fast' costs about k passes over the group: k >= 20 with m >= 3k;
  at m = 64, k = 24 it loses 1.5x) or the groups are long with many experts
  (m >= 320 with n >= 32: 0.40-0.63x of 'fast's time at k = 8 and 16), and
  loses elsewhere at k <= 16 (1.3-2.5x of 'fast's time with n = 8, m up to
  512 -- the tiny config's m = 64, n = 8, k = 16: 1.7x --, 1.1-1.6x with
  n = 32, m <= 256); it needs 2k < m (`ot.candidates.applies`).
  GPU: keeps 'fast' (RESULTS.md, one H200). 'candidates' lost there (B/32
  shapes, G = 512: 31.0 ms against 'fast''s 26.0 ms, 2026-11-26). The fused
  kernel ('pallas') compiles and routes like 'fast' there, and alone at G = 512
  it takes 11.0 ms against 'fast''s 26.0 (4 warps, 2026-11-28); but in the only
  train step measured with it (S/32, G = 64 per layer, at 16 warps, its default
  then) it was slower than 'fast' (74.5 against 70.9 ms), and its step at 4 warps
  is unmeasured (as is any run on several GPUs, where each device solves its own
  groups: `_solve_plans`). So it is not picked until a step measurement shows it
  wins. Other backends (TPU): unmeasured, keep 'fast'.
  """
  if backend != "cpu" or not 2 * k < m:
    return "fast"
  if (k >= 20 and m >= 3 * k) or (n >= 32 and m >= 320):
    return "candidates"
  return "fast"


def picked_implementation(opts: SparseOTOptions, group_size: int, num_experts: int,
                          backend: Optional[str] = None) -> str:
  """The path `opts.implementation` runs at these routing shapes: itself, or for
  'auto' the one its rule picks (`_auto`); 'reference' wherever L-BFGS solves."""
  if opts.solver != "adam":
    return "reference"
  if opts.implementation != "auto":
    return opts.implementation
  if opts.form == "expert_choice":
    m, n, k = group_size, num_experts, capacity(opts, group_size, num_experts)
  else:
    m, n, k = num_experts, group_size, min(opts.num_selected_experts, num_experts)
  return _auto(m, n, k, backend or jax.default_backend())


@functools.lru_cache(maxsize=None)
def _warn_interpret_once() -> None:
  warnings.warn("sparse_ot implementation='pallas' on the CPU runs the fused kernel in "
                "Pallas interpret mode, meant for tests: it is much slower than 'fast' "
                "(what implementation='auto' picks on the CPU).", stacklevel=3)


def _solve_plans(cost: Array, a: Array, b: Array, k: int, opts: SparseOTOptions) -> Array:
  """(G, m, n) plans of G semi-duals, <= k nonzeros per column."""
  if opts.implementation == "auto" and opts.solver == "adam":
    _, m, n = cost.shape
    opts = dataclasses.replace(opts, implementation=_auto(m, n, k, jax.default_backend()))
  if opts.solver == "adam" and opts.implementation == "fast":
    return ot.batched_semi_dual_adam(cost, a, b, k, opts.gamma, opts.num_steps,
                                     opts.learning_rate)
  if opts.solver == "adam" and opts.implementation == "pallas":
    if jax.default_backend() == "cpu":
      _warn_interpret_once()
    # One custom call: split by hand over the devices that hold the groups, or XLA
    # gathers every group onto every device and solves them all there.
    return sharding.per_shard(
        lambda c, a, b: ot.batched_semi_dual_adam_pallas(c, a, b, k, opts.gamma,
                                                         opts.num_steps, opts.learning_rate),
        cost, a, b)
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
