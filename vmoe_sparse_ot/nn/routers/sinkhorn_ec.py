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
  """(G, S, E) entropic plans of (G, S, E) logits, padding rows 0 (no gradient): S-BASE's."""
  return sbase.plans(logits, token_mask, opts)


def route(logits: Array, token_mask: Array, opts: SinkhornECOptions, capacity: int,
          train: bool, rng: Optional[Array]) -> rt.Routing:
  del train, rng
  token_index, valid = rt.assign_expert_choice(plans(logits, token_mask, opts), token_mask,
                                               capacity)
  gates = jax.nn.softmax(logits, axis=-1)
  return base.finish(gates, token_index, valid, base.zero_loss())


ROUTER = base.Router(name="sinkhorn_ec", options=SinkhornECOptions, route=route,
                     capacity=expert_choice.capacity)
