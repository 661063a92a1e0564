"""'sinkhorn_ec': Sinkhorn expert choice, as in the router study of Liu et al. (TMLR 2024).

Per group, an entropic OT plan between tokens and experts on the cost -logits
(the S-BASE problem: mass 1 per real token, (real tokens) / E per expert;
padding tokens get no mass), `num_iters` log-domain Sinkhorn iterations from
zero potentials in the order `first_update` names (see `sbase`). Then each
expert takes the C tokens with the largest plan entries in its column (expert
choice on the plan instead of on the softmax gates), and the combine weights
are softmax(logits) at the chosen (token, expert) pairs, as S-BASE's. No
gradient flows through Sinkhorn or the choice; no auxiliary loss, no noise.
A token may go to any number of experts, or none.

C as `expert_choice`'s: ceil(S * capacity_factor / E) rounded up to a multiple
of 4, capped at S; `capacity` sets it directly. `num_selected_experts` plays no
part here.
"""
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base
from vmoe_sparse_ot.nn.routers import expert_choice
from vmoe_sparse_ot.nn.routers import sbase

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SinkhornECOptions(sbase.SBaseOptions):
  """S-BASE's Sinkhorn options (epsilon, num_iters, first_update), under this router's
  own name in the config (`router.sinkhorn_ec.*`)."""


def plans(logits: Array, token_mask: Array, opts: SinkhornECOptions) -> Array:
  """(G, S, E) entropic plans of (G, S, E) logits, padding rows 0 (no gradient)."""
  e = logits.shape[-1]
  mask = token_mask.astype(jnp.float32)
  # A group with no real token (never made by the MoE layer) would have no mass at all.
  tokens = jnp.where(jnp.any(token_mask, axis=1, keepdims=True), mask, 1.0)      # (G, S)
  experts = jnp.broadcast_to(jnp.sum(tokens, axis=1, keepdims=True) / e,
                             tokens.shape[:1] + (e,))                           # (G, E)
  cost = -jax.lax.stop_gradient(logits).astype(jnp.float32)
  return sbase.entropic_plans(cost, tokens, experts, opts.epsilon, opts.num_iters,
                              opts.first_update)


def route(logits: Array, token_mask: Array, opts: SinkhornECOptions, capacity: int,
          train: bool, rng: Optional[Array]) -> rt.Routing:
  del train, rng
  token_index, valid = rt.assign_expert_choice(plans(logits, token_mask, opts), token_mask,
                                               capacity)
  gates = jax.nn.softmax(logits, axis=-1)
  return base.finish(gates, token_index, valid, base.zero_loss())


ROUTER = base.Router(name="sinkhorn_ec", options=SinkhornECOptions, route=route,
                     capacity=expert_choice.capacity)
