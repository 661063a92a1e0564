"""'sbase': Sinkhorn-BASE (Clark et al. 2022), as adapted to V-MoE in the paper's Appendix A.5.

Entropic OT per group with cost -logits, mass 1 per real token and (real
tokens)/E per expert (the S-BASE problem of Appendix A.5; masked padding tokens
get no mass, so the real tokens route as they would alone), `num_iters`
log-domain Sinkhorn iterations from zero potentials; each token takes the top-K
experts of its plan row, slots as in TopK; combine weights softmax(logits). No
gradient flows through Sinkhorn.

Update order: the reference implementation (OTT's Sinkhorn, as used by the
paper's code) updates the expert potential g first and the token potential f
second in every iteration, so after a fixed number of iterations each token's
row sums to exactly 1 and the expert columns are approximate. `first_update =
'experts'` (default) does that; 'tokens' updates f first (columns exact). The
two differ on peaked logits, where 20 iterations are far from convergence.
"""
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SBaseOptions(base.CommonOptions):
  epsilon: float = base.option(1.0, "Entropic regularization.", check=base.POSITIVE)
  num_iters: int = base.option(20, "Sinkhorn iterations (fixed, no tolerance).",
                               check=base.AT_LEAST_ONE)
  first_update: str = base.option(
      "experts", "Which potential each iteration updates first: 'experts' (g, as OTT "
      "does) or 'tokens' (f).", choices=("experts", "tokens"))


def entropic_plans(cost: Array, tokens: Array, experts: Array, epsilon: float, num_iters: int,
                   first_update: str) -> Array:
  """(G, S, E) log-domain Sinkhorn plans of (G, S, E) costs, masses tokens (G, S), experts (G, E).

  `num_iters` fixed iterations from zero potentials; `first_update` 'experts'
  updates the expert potential first in each iteration (token rows exact at the
  end, as OTT), 'tokens' the token potential (expert columns exact).
  """
  def solve(c, a, b):
    # ot.sinkhorn updates the row potential first: rows are the potential that
    # must go first, so the 'experts' order solves the transposed problem.
    if first_update == "experts":
      return ot.sinkhorn(b, a, c.T, epsilon, max_iter=num_iters, tol=0.0).plan.T
    return ot.sinkhorn(a, b, c, epsilon, max_iter=num_iters, tol=0.0).plan

  return jax.vmap(solve)(cost, tokens, experts)


def masses(token_mask: Array, num_experts: int) -> tuple[Array, Array]:
  """The S-BASE marginals of (G, S) token masks: (tokens (G, S), experts (G, E)).

  Mass 1 per real token and 0 per padding token, (real tokens) / E per expert:
  padding then has no plan row to fill, and the real tokens' plan is the one of
  routing them alone. A group with no real token (the MoE layer makes none)
  counts all its tokens, so that Sinkhorn has mass to move.
  """
  mask = token_mask.astype(jnp.float32)
  tokens = jnp.where(jnp.any(token_mask, axis=1, keepdims=True), mask, 1.0)
  experts = jnp.broadcast_to(jnp.sum(tokens, axis=1, keepdims=True) / num_experts,
                             tokens.shape[:1] + (num_experts,))
  return tokens, experts


def plans(logits: Array, token_mask: Array, opts: SBaseOptions) -> Array:
  """(G, S, E) entropic plans of (G, S, E) logits, padding rows 0 (no gradient)."""
  tokens, experts = masses(token_mask, logits.shape[-1])
  cost = -jax.lax.stop_gradient(logits).astype(jnp.float32)
  return entropic_plans(cost, tokens, experts, opts.epsilon, opts.num_iters, opts.first_update)


def route(logits: Array, token_mask: Array, opts: SBaseOptions, capacity: int, train: bool,
          rng: Optional[Array]) -> rt.Routing:
  del train, rng
  e = logits.shape[-1]
  k = min(opts.num_selected_experts, e)
  token_index, valid = base.assign_top_k(plans(logits, token_mask, opts), token_mask, e, k, capacity,
                                         opts.batch_priority)
  gates = jax.nn.softmax(logits, axis=-1)
  return base.finish(gates, token_index, valid, base.zero_loss())


ROUTER = base.Router(name="sbase", options=SBaseOptions, route=route,
                     experts_per_token=base.top_k_per_token)
