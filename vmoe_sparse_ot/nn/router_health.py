"""Router health from the router's logits: the z-loss, the entropy, the top choice.

Every router starts from logits over the experts, (G, S, E), or over every
expert's slots, (G, S, E, C) (Soft MoE, whose combine weights are a softmax over
all E*C slots). From them, over the real tokens (`token_mask`; padding never
counts), each MoE layer reports, whatever its router:

- `z_loss`: ST-MoE's router z-loss, the mean over tokens of logsumexp(l)^2,
  the logsumexp over all of a token's logits (E, or E*C). It grows with the
  logits' scale; as a loss (`router.z_loss_weight` > 0) it keeps the logits
  small, which bfloat16 rounding and large models need.
- `router_entropy`: the mean over tokens of the entropy (nats) of p, the
  softmax over experts (for Soft MoE the softmax over slots, summed over each
  expert's slots). log E when every expert is equally likely, 0 for a one-hot
  router: it falls as the router grows confident, or collapses.
- `router_top_prob`: the mean over tokens of max_e p, in [1/E, 1].

They read the clean logits: gate noise (TopK's, Soft MoE's) is the router's
own and stays out. The experts that get no token in a step are counted from
the routing (`routing_metrics.common_metrics`, `empty_experts`).

Shapes: G groups, S tokens per group, E experts, C slots per expert.
"""
from typing import Dict, Tuple

import jax
import jax.numpy as jnp

Array = jax.Array


def _by_expert(logits: Array) -> Array:
  """(G, S, E) or (G, S, E, C) float32 logits -> (G, S, E, C') (C' = 1 or C)."""
  logits = logits.astype(jnp.float32)
  return logits[..., None] if logits.ndim == 3 else logits


def _token_mean(values: Array, token_mask: Array) -> Array:
  """Mean of (G, S) values over the real tokens (0 when there is none)."""
  mask = token_mask.astype(jnp.float32)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def log_normalizer(logits: Array) -> Array:
  """(G, S): logsumexp of each token's logits, over all its trailing axes."""
  x = _by_expert(logits)
  return jax.nn.logsumexp(x.reshape(*x.shape[:2], -1), axis=-1)


def z_loss(logits: Array, token_mask: Array) -> Array:
  """The router z-loss: mean over real tokens of logsumexp(logits)^2 (scalar).

  logits: (G, S, E) or (G, S, E, C); token_mask: (G, S) bool. Differentiable.
  """
  return _token_mean(jnp.square(log_normalizer(logits)), token_mask)


def expert_log_probs(logits: Array) -> Array:
  """(G, S, E): log p, p the softmax over all of a token's logits summed per expert."""
  x = _by_expert(logits)
  log_p = x - log_normalizer(logits)[..., None, None]
  return jax.nn.logsumexp(log_p, axis=-1)


def entropy(logits: Array, token_mask: Array) -> Array:
  """Mean over real tokens of -sum_e p_e log p_e (nats), p = `expert_log_probs`'s exp."""
  log_p = expert_log_probs(logits)
  p = jnp.exp(log_p)
  # 0 log 0 = 0: an expert a logit of -inf rules out adds nothing.
  per_token = -jnp.sum(jnp.where(p > 0, p * log_p, 0.0), axis=-1)
  return _token_mean(per_token, token_mask)


def top_probability(logits: Array, token_mask: Array) -> Array:
  """Mean over real tokens of max_e p_e, p as in `entropy`."""
  return _token_mean(jnp.exp(jnp.max(expert_log_probs(logits), axis=-1)), token_mask)


def logit_metrics(logits: Array, token_mask: Array) -> Tuple[Dict[str, Array], Array]:
  """({'z_loss', 'router_entropy', 'router_top_prob'} without gradient, the z-loss with it).

  logits: (G, S, E) or (G, S, E, C), the logits the router routes with; token_mask (G, S).
  """
  z = z_loss(logits, token_mask)
  metrics = {"z_loss": z, "router_entropy": entropy(logits, token_mask),
             "router_top_prob": top_probability(logits, token_mask)}
  return jax.tree.map(jax.lax.stop_gradient, metrics), z


def with_z_loss(auxiliary_loss: Array, z: Array, weight: float) -> Array:
  """The layer's auxiliary loss: the router's, plus weight * z-loss when weight > 0.

  A weight of 0 returns the router's loss itself (the same program and numbers
  as before the option existed).
  """
  return auxiliary_loss + weight * z if weight else auxiliary_loss
