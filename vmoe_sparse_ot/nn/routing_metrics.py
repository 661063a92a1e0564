"""The routing metrics every MoE layer reports, whatever its router.

They are computed from the routing result alone, in one place (`common_metrics`,
which `MoeLayer` calls), from which tokens reach which experts: `dispatched`
(G, S, E) bool. Only real tokens count (`token_mask`; group padding never does).

- Sparse routers (`Routing`): token s reaches expert e when one of e's valid
  buffer slots holds s. Load[g, e] = number of tokens expert e takes in group g.
- Soft MoE (`SoftRouting`): every slot mixes all of the group's tokens and
  every token gets a mix of all slots, so every real token reaches every
  expert: nothing is dropped, every token has E experts, and each expert's load
  is the group's number of real tokens (max load violation 0).

Metrics (scalars, no gradient):
- `dropped_fraction`: fraction of real tokens that no expert processes (they
  keep only the residual); the same number as `tokens_with_0_experts`, kept
  under its older name.
- `tokens_with_0_experts`, `tokens_with_1_expert`, `tokens_with_2plus_experts`:
  fractions of real tokens by how many experts process them (they sum to 1).
- `experts_per_token`: mean number of experts per real token.
- `max_load_violation` ("MaxVio"): max_e load / mean_e load - 1 per group,
  averaged over the groups that have a token dispatched; 0 when every expert
  takes the same number of tokens.
- `tokens_per_expert_min`, `_mean`, `_max`: load over all (group, expert) pairs.
- `empty_experts`: how many experts no real token reaches in any group of the
  layer's call (a collapsing router leaves experts idle; with microsteps, the
  mean over the step's microbatches).

`token_counts` is also how the evaluation job (`nn.routing_stats`) counts
tokens by number of experts, so training and evaluation agree by construction.

Shapes: G groups, S tokens per group, E experts, C capacity.
"""
from typing import Dict

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt

Array = jax.Array


def dispatched(routing, token_mask: Array) -> Array:
  """(G, S, E) bool: real token s of group g reaches expert e (see the module doc)."""
  real = token_mask[..., None]
  if isinstance(routing, rt.SoftRouting):
    return jnp.broadcast_to(real, routing.combine_weight.shape[:3])
  token_index = jax.lax.stop_gradient(routing.token_index)
  _, e, c = token_index.shape
  experts = jnp.broadcast_to(jnp.arange(e, dtype=jnp.int32)[:, None], (e, c)).reshape(-1)

  def scatter(t, v):
    return jnp.zeros((token_mask.shape[1], e), jnp.int32).at[t.reshape(-1), experts].add(
        v.reshape(-1).astype(jnp.int32))

  return (jax.vmap(scatter)(token_index, routing.valid) > 0) & real


def token_counts(experts_per_token: Array, real: Array) -> Dict[str, Array]:
  """int32 counts of real tokens: all, and those with 0, 1, 2 or more experts.

  experts_per_token: int (...) experts that process each token; real: bool (...).
  """
  def count(where):
    return jnp.sum(where & real, dtype=jnp.int32)

  return {
      "tokens": jnp.sum(real, dtype=jnp.int32),
      "with_0": count(experts_per_token == 0),
      "with_1": count(experts_per_token == 1),
      "with_2plus": count(experts_per_token >= 2),
  }


def max_load_violation(load: Array) -> Array:
  """Mean over groups of max_e load / mean_e load - 1; load (G, E).

  Groups where no expert takes a token (all padding) do not count.
  """
  load = load.astype(jnp.float32)
  mean = jnp.mean(load, axis=-1)
  counted = mean > 0
  per_group = jnp.max(load, axis=-1) / jnp.where(counted, mean, 1.0) - 1.0
  return jnp.sum(jnp.where(counted, per_group, 0.0)) / jnp.maximum(jnp.sum(counted), 1)


def common_metrics(routing, token_mask: Array) -> Dict[str, Array]:
  """The metrics of the module doc for a `Routing` or `SoftRouting`; token_mask (G, S)."""
  hits = dispatched(routing, token_mask)
  per_token = jnp.sum(hits, axis=-1, dtype=jnp.int32)                    # (G, S)
  load = jnp.sum(hits, axis=1, dtype=jnp.int32).astype(jnp.float32)      # (G, E)
  counts = token_counts(per_token, token_mask)
  num_real = jnp.maximum(counts["tokens"], 1).astype(jnp.float32)
  return {
      "dropped_fraction": counts["with_0"] / num_real,
      "tokens_with_0_experts": counts["with_0"] / num_real,
      "tokens_with_1_expert": counts["with_1"] / num_real,
      "tokens_with_2plus_experts": counts["with_2plus"] / num_real,
      "experts_per_token": jnp.sum(per_token) / num_real,
      "max_load_violation": max_load_violation(load),
      "tokens_per_expert_min": jnp.min(load),
      "tokens_per_expert_mean": jnp.mean(load),
      "tokens_per_expert_max": jnp.max(load),
      "empty_experts": jnp.sum(jnp.sum(load, axis=0) == 0).astype(jnp.float32),
  }
