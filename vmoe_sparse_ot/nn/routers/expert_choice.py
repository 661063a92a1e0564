"""'expert_choice': each expert takes its top-C tokens by softmax gate (Zhou et al. 2022).

Combine weights are the softmax gates; no auxiliary loss. A token may go to
any number of experts, or none.
"""
import dataclasses
from typing import Optional

import jax

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ExpertChoiceOptions(base.CommonOptions):
  pass


def route(logits: Array, token_mask: Array, opts: ExpertChoiceOptions, capacity: int,
          train: bool, rng: Optional[Array]) -> rt.Routing:
  del opts, train, rng
  gates = jax.nn.softmax(logits, axis=-1)
  token_index, valid = rt.assign_expert_choice(jax.lax.stop_gradient(gates), token_mask,
                                               capacity)
  return base.finish(gates, token_index, valid, token_mask, base.zero_loss())


ROUTER = base.Router(name="expert_choice", options=ExpertChoiceOptions, route=route)
