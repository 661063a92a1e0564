"""Routing results shared by all routers: capacity, slot assignment.

Every router returns a `Routing`: for each group g, expert e and buffer slot
c < C, which token fills the slot (`token_index`), whether it is filled
(`valid`) and the weight with which the expert's output for that token is added
back (`combine_weight`). This expert-side form covers token-choice routers
(TopK, S-BASE: tokens pick experts, then take buffer slots in priority order)
and expert-choice routers (experts pick tokens), and by construction no expert
ever receives more than C tokens. The dispatchers in `dispatch.py` turn it into
gathers/scatters or one-hot einsums.

Soft routers (Soft MoE) return a `SoftRouting` instead: every one of an
expert's C slots takes a convex combination of all the group's tokens (dense
dispatch weights), and every token a convex combination of all slots' outputs
(dense combine weights). The dispatchers accept both forms.

Shapes: G groups, S tokens per group, E experts, C capacity, K experts per token.
"""
import math
from typing import Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp

Array = jax.Array


class Routing(NamedTuple):
  """Which token each expert buffer slot holds, and its combine weight.

  Attributes:
    token_index: (G, E, C) int32, token (in [0, S)) held by each slot; 0 where
      the slot is empty.
    valid: (G, E, C) bool, whether the slot holds a token.
    combine_weight: (G, E, C) float, gate of (token, expert), 0 where empty.
      Differentiable with respect to the router logits.
    auxiliary_loss: scalar, already weighted.
    metrics: {name: scalar}, the router's own (`auxiliary_loss`, ...); the MoE
      layer adds the common ones (`routing_metrics.common_metrics`).
  """
  token_index: Array
  valid: Array
  combine_weight: Array
  auxiliary_loss: Array
  metrics: Dict[str, Array]


class SoftRouting(NamedTuple):
  """Dense dispatch and combine weights between tokens and expert slots.

  Attributes:
    dispatch_weight: (G, S, E, C) float, slot (e, c) takes
      sum_s dispatch_weight[g, s, e, c] * x[g, s]; sums to 1 over S (padding 0).
    combine_weight: (G, S, E, C) float, token s gets
      sum_{e, c} combine_weight[g, s, e, c] * out[g, e, c]; sums to 1 over
      (E, C) for real tokens, 0 for padding.
    auxiliary_loss: scalar, already weighted.
    metrics: {name: scalar}.
  """
  dispatch_weight: Array
  combine_weight: Array
  auxiliary_loss: Array
  metrics: Dict[str, Array]


def expert_weights(routing, group_size: int) -> Array:
  """(G, S, E) float32: the total combine weight each token gets from each expert.

  0 where the token was not dispatched to the expert; for a `SoftRouting` the
  sum over the expert's slots.
  """
  if isinstance(routing, SoftRouting):
    return jnp.sum(routing.combine_weight, axis=-1).astype(jnp.float32)
  g, e, c = routing.token_index.shape
  w = jnp.where(routing.valid, routing.combine_weight, 0).astype(jnp.float32)
  experts = jnp.broadcast_to(jnp.arange(e, dtype=jnp.int32)[:, None], (e, c))

  def scatter(t, w):
    return jnp.zeros((group_size, e), jnp.float32).at[t.reshape(-1), experts.reshape(-1)].add(
        w.reshape(-1))

  return jax.vmap(scatter)(routing.token_index, w)


CEIL_OR_ROUND = ("ceil", "round")


def compute_capacity(group_size: int, num_experts: int, num_selected_experts: int,
                     capacity_factor: float, capacity: Optional[int] = None, *,
                     ceil_or_round: str = "ceil", multiple_of: int = 4) -> int:
  """C from the capacity factor, as the reference V-MoE's `compute_capacity`, capped at S.

  With T = S*K tokens to spread over E experts (the reference's `num_tokens`):
  C = ceil(T*capacity_factor/E) (`ceil_or_round='ceil'`, the default) or Python's
  round(T*capacity_factor/E) ('round': halves go to the even integer, as there),
  then raised to the next multiple of `multiple_of` (0 or 1: left as is), and
  capped at S (the reference leaves it above S). An explicit `capacity` is used
  as is (also capped at S). Raises ValueError when C would be below 1, as the
  reference does ('round' of a value under 0.5).
  """
  if capacity is not None:
    if capacity < 1:
      raise ValueError(f"capacity must be >= 1 or None, got {capacity}")
    return min(int(capacity), group_size)
  if capacity_factor <= 0:
    raise ValueError(f"capacity_factor must be > 0, got {capacity_factor}")
  if ceil_or_round not in CEIL_OR_ROUND:
    raise ValueError(f"capacity_ceil_or_round must be one of {list(CEIL_OR_ROUND)}, "
                     f"got {ceil_or_round!r}")
  if multiple_of < 0:
    raise ValueError(f"capacity_multiple_of must be >= 0, got {multiple_of}")
  target = group_size * num_selected_experts * capacity_factor / num_experts
  c = int(math.ceil(target) if ceil_or_round == "ceil" else round(target))
  if c < 1:
    raise ValueError(f"capacity_factor={capacity_factor} gives C = {ceil_or_round}"
                     f"({group_size * num_selected_experts} * {capacity_factor} / {num_experts})"
                     f" = {c} slots per expert; C must be >= 1")
  if multiple_of > 0:
    c += (-c) % multiple_of
  return min(c, group_size)


def assign_token_choice(expert_index: Array, token_mask: Array, num_experts: int,
                        capacity: int, priority: Optional[Array] = None,
                        choice_mask: Optional[Array] = None) -> tuple[Array, Array]:
  """Gives buffer slots to tokens' chosen experts in priority order (V-MoE Alg. 1).

  All tokens' first choices are served before any second choice; within one
  choice rank, tokens go in order of position, or of decreasing `priority` when
  given (batch-prioritized routing). A choice whose expert is full is dropped.

  Args:
    expert_index: (G, S, K) int, experts chosen by each token, best first.
    token_mask: (G, S) bool, False for padding tokens (never assigned).
    num_experts: E.
    capacity: C.
    priority: optional (G, S) float; larger claims capacity first.
    choice_mask: optional (G, S, K) bool, False for choices to ignore.

  Returns:
    token_index (G, E, C) int32 and valid (G, E, C) bool.
  """
  g, s, k = expert_index.shape
  token_ids = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (g, s))
  choice = jnp.broadcast_to(token_mask[..., None], (g, s, k))
  if choice_mask is not None:
    choice = choice & choice_mask
  if priority is not None:
    order = jnp.argsort(-priority, axis=1, stable=True).astype(jnp.int32)
    expert_index = jnp.take_along_axis(expert_index, order[..., None], axis=1)
    choice = jnp.take_along_axis(choice, order[..., None], axis=1)
    token_ids = order
  # Rank-major order: (G, K, S) flattened, so every first choice precedes seconds.
  onehot = jax.nn.one_hot(expert_index, num_experts, dtype=jnp.int32)  # (G,S,K,E)
  onehot = onehot * choice[..., None].astype(jnp.int32)
  onehot = jnp.swapaxes(onehot, 1, 2).reshape(g, k * s, num_experts)
  position = jnp.cumsum(onehot, axis=1) - 1                            # (G,KS,E)
  slot = jnp.sum(position * onehot, axis=-1)                           # (G,KS)
  keep = (jnp.sum(onehot, axis=-1) > 0) & (slot < capacity)
  flat_expert = jnp.swapaxes(expert_index, 1, 2).reshape(g, k * s)
  flat_token = jnp.tile(token_ids, (1, k))
  # Dropped choices get an out-of-range slot, which the scatter ignores.
  slot = jnp.where(keep, slot, capacity)

  def scatter(e, c, t, v):
    tok = jnp.zeros((num_experts, capacity), jnp.int32).at[e, c].set(t, mode="drop")
    val = jnp.zeros((num_experts, capacity), bool).at[e, c].set(v, mode="drop")
    return tok, val

  return jax.vmap(scatter)(flat_expert, slot, flat_token, keep)


def assign_expert_choice(scores: Array, token_mask: Array, capacity: int,
                         min_score: Optional[float] = None) -> tuple[Array, Array]:
  """Each expert takes its `capacity` highest-scoring tokens.

  Args:
    scores: (G, S, E), larger is better.
    token_mask: (G, S) bool, False for padding tokens (never taken).
    capacity: C.
    min_score: if given, a slot is valid only when its score is > min_score
      (used for sparse plans: only tokens in the support of the column).

  Returns:
    token_index (G, E, C) int32 and valid (G, E, C) bool.
  """
  scores = jnp.where(token_mask[..., None], scores, -jnp.inf)
  values, token_index = jax.lax.top_k(jnp.swapaxes(scores, 1, 2), capacity)
  valid = jnp.isfinite(values)
  if min_score is not None:
    valid &= values > min_score
  return token_index.astype(jnp.int32), valid


def gather_gates(gates: Array, token_index: Array, valid: Array) -> Array:
  """combine_weight[g, e, c] = gates[g, token_index[g, e, c], e] (0 if invalid).

  gates: (G, S, E); token_index, valid: (G, E, C). Differentiable in `gates`.
  """
  w = jnp.take_along_axis(jnp.swapaxes(gates, 1, 2), token_index, axis=2)
  return jnp.where(valid, w, 0.0)
