"""'expert_choice': each expert takes its top-C tokens by softmax gate (Zhou et al. 2022).

As the reference V-MoE's expert-choice router: the gates are the softmax of the
logits plus Gaussian noise of std noise_std / E in training (the key and scale
TopK uses; 0 disables it); each expert takes the C tokens with the largest
gates, and combine weights are those gates. No auxiliary loss. A token may go
to any number of experts, or none.

C counts tokens per expert, so it comes from S / E, not S * K / E: C =
ceil(S * capacity_factor / E) rounded up to a multiple of 4 (the reference's
`compute_capacity`), capped at S; `capacity` sets it directly.
`num_selected_experts` plays no part here.
"""
import dataclasses
from typing import Optional

import jax

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class ExpertChoiceOptions(base.CommonOptions):
  noise_std: Optional[float] = base.option(
      1.0, "Gate noise in training, in units of 1/E (std noise_std / E, as TopK's); 0 "
      "disables it. None: 1.0.", check=base.NON_NEGATIVE, top_level=True)


def capacity(opts: ExpertChoiceOptions, group_size: int, num_experts: int) -> int:
  """C = ceil(S * capacity_factor / E) rounded up to a multiple of 4 (at most S), or as
  `capacity_ceil_or_round` and `capacity_multiple_of` say."""
  return rt.compute_capacity(group_size, num_experts, 1, opts.capacity_factor, opts.capacity,
                             ceil_or_round=opts.capacity_ceil_or_round,
                             multiple_of=opts.capacity_multiple_of)


def route(logits: Array, token_mask: Array, opts: ExpertChoiceOptions, capacity: int,
          train: bool, rng: Optional[Array]) -> rt.Routing:
  std = base.gate_noise_std(opts.noise_std, logits.shape[-1])
  if train and std > 0:
    logits = logits + std * jax.random.normal(rng, logits.shape, logits.dtype)
  gates = jax.nn.softmax(logits, axis=-1)
  token_index, valid = rt.assign_expert_choice(jax.lax.stop_gradient(gates), token_mask,
                                               capacity)
  return base.finish(gates, token_index, valid, base.zero_loss())


def needs_rng(opts: ExpertChoiceOptions, train: bool) -> bool:
  return train and base.gate_noise_std(opts.noise_std, 1) > 0


ROUTER = base.Router(name="expert_choice", options=ExpertChoiceOptions, route=route,
                     capacity=capacity, needs_rng=needs_rng)
