"""'topk_bias': auxiliary-loss-free balancing (Wang et al. 2024, as in DeepSeek-V3).

Gates softmax(logits) (no noise). Each layer keeps a per-expert bias b (E,),
router state: a token takes the K experts with the largest gates[e] + b[e],
but its combine weights are the unbiased gates, as TopK's; buffer slots in
priority order as TopK (with batch_priority, by the largest biased score). No
gradient flows through b or the choice.

After each optimizer step (outside the gradient) the bias moves toward
balance: b_i += u * sign(mean_j load_j - load_i), where load_i counts the real
tokens that chose expert i in that step's batch (all groups, all microbatches
of the step, before capacity drops tokens) and u = `update_rate` (0 freezes
b). The bias starts at zero (also when a run is initialized from weights that
have none); evaluation uses the current bias and never changes it.

Optional complementary balance loss (DeepSeek-V3's sequence-wise loss, with a
group as the sequence), weight alpha = `balance_loss_weight` (default 0):
  L = alpha * mean over groups of sum_i f_i P_i,
  f_i = E / (K T) * (number of the group's T real tokens whose top-K holds i),
  P_i = (1 / T) * sum over those tokens of gates[t, i];
sum_i f_i P_i is 1 when the choices and gates are spread evenly.

Metrics: `balance_loss` (sum_i f_i P_i, unweighted), `bias_range` (max_i b_i -
min_i b_i) and `selected_max_load_violation` (max_i load_i / mean_i load_i - 1
over the whole layer call before capacity: the paper's MaxVio_batch).
"""
import dataclasses
from typing import Dict, Optional, Tuple

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TopKBiasOptions(base.CommonOptions):
  update_rate: float = base.option(
      1e-3, "u: after each optimizer step, b_i += u * sign(mean load - load_i) "
      "(0 keeps the bias at zero).", check=base.NON_NEGATIVE)
  balance_loss_weight: float = base.option(
      0.0, "alpha of the complementary sequence-wise balance loss (0: none).",
      check=base.NON_NEGATIVE)


def init_state(opts: TopKBiasOptions, num_experts: int) -> Dict[str, Array]:
  """{'bias': zeros (E,) float32}."""
  del opts
  return {"bias": jnp.zeros((num_experts,), jnp.float32)}


def update_state(opts: TopKBiasOptions, state: Dict[str, Array],
                 statistics: Dict[str, Array]) -> Dict[str, Array]:
  """b + u * sign(mean load - load), load (E,) int32 counts of the step."""
  load = statistics["load"]
  # sign(mean - load_i) = sign(sum - E * load_i), exact on integer counts.
  direction = jnp.sign(jnp.sum(load) - load.shape[-1] * load).astype(jnp.float32)
  return {"bias": state["bias"] + jnp.float32(opts.update_rate) * direction}


def select(gates: Array, bias: Array, k: int) -> Tuple[Array, Array]:
  """(top biased scores (G, S, K), expert_index (G, S, K)) of gates (G, S, E) + bias (E,)."""
  return jax.lax.top_k(jax.lax.stop_gradient(gates) + bias.astype(gates.dtype), k)


def balance_loss(gates: Array, selected: Array, token_mask: Array, k: int) -> Array:
  """Mean over groups of sum_i f_i P_i (module doc); gates, selected (G, S, E)."""
  e = gates.shape[-1]
  mask = token_mask[..., None].astype(gates.dtype)
  num_real = jnp.maximum(jnp.sum(mask, axis=1), 1.0)                         # (G, 1)
  f = e / (k * num_real) * jnp.sum(selected * mask, axis=1)                 # (G, E)
  p = jnp.sum(gates * mask, axis=1) / num_real                              # (G, E)
  real = jnp.any(token_mask, axis=1).astype(gates.dtype)
  return jnp.sum(jnp.sum(f * p, axis=-1) * real) / jnp.maximum(jnp.sum(real), 1.0)


def route(logits: Array, token_mask: Array, opts: TopKBiasOptions, capacity: int, train: bool,
          rng: Optional[Array], state: Dict[str, Array]):
  """(Routing, {'load': (E,) int32}) of (G, S, E) logits with the layer's bias."""
  del train, rng
  e = logits.shape[-1]
  k = min(opts.num_selected_experts, e)
  gates = jax.nn.softmax(logits, axis=-1)
  bias = state["bias"]
  top, expert_index = select(gates, bias, k)
  priority = top[..., 0] if opts.batch_priority else None
  token_index, valid = rt.assign_token_choice(expert_index, token_mask, e, capacity, priority)
  selected = jnp.sum(jax.nn.one_hot(expert_index, e, dtype=gates.dtype), axis=-2)   # (G, S, E)
  load = jnp.sum(selected * token_mask[..., None], axis=(0, 1)).astype(jnp.int32)  # (E,)
  bal = balance_loss(gates, selected, token_mask, k)
  load_f = load.astype(jnp.float32)
  mean = jnp.mean(load_f)
  extra = {
      "balance_loss": jax.lax.stop_gradient(bal),
      "bias_range": jnp.max(bias) - jnp.min(bias),
      "selected_max_load_violation": jnp.where(mean > 0, jnp.max(load_f) / mean - 1.0, 0.0),
  }
  routing = base.finish(gates, token_index, valid, opts.balance_loss_weight * bal, extra)
  return routing, {"load": load}


ROUTER = base.Router(name="topk_bias", options=TopKBiasOptions, route=route,
                     state=base.RouterState(init=init_state, update=update_state),
                     experts_per_token=base.top_k_per_token)
