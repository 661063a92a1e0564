"""Per-token routing, read from the `expert_weights` each MoE layer sows.

`model.apply(..., mutable=['intermediates'])` returns, per MoE layer, float32
(G, S, E): the total combine weight each token receives from each expert, 0 where
the token was not dispatched to it. The layer flattened the batch's B*N tokens
image-major and cut them into G groups of S, padding the last group; so
`per_image` undoes that: (G*S, E)[:B*N] reshaped to (B, N, E), the group padding
dropped. N counts every token the encoder sees (the class token first, for
`classifier='token'`).

A token is *dispatched* to expert e when its weight from e is > 0, and *dropped*
when its weights from all experts are 0 (it got no expert and keeps only the
residual). `routing_sums` counts, over the real examples of a batch (eval batches
are padded with masked examples, which must not count):
- `tokens`: real tokens;
- `dropped`, `with_1`, `with_2plus`: real tokens with no expert, one, two or more
  (counted by `nn.routing_metrics.token_counts`, as the training metrics are);
- `expert_tokens` (E,): real tokens each expert took;
and `summarize` turns sums over a whole eval set into fractions: the dropped
fraction, the fractions of tokens with one and with two or more experts, the
load per expert (the fraction of tokens each expert took; it sums over experts
to the mean number of experts per token) and experts per token.
Counts are int32 (exact up to 2^31 tokens), summed on device.

Shapes: G groups, S tokens per group, E experts, B images, N tokens per image.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from vmoe_sparse_ot.nn.routing_metrics import token_counts

Array = jax.Array


def layer_weights(intermediates: Mapping[str, Any]) -> dict[str, Array]:
  """{layer name: (G, S, E)} from `model.apply`'s mutable state, in block order."""
  encoder = intermediates.get('intermediates', intermediates).get('encoder', {})
  out = {}
  for layer in sorted(encoder, key=lambda name: (len(name), name)):
    moe = encoder[layer].get('moe') if hasattr(encoder[layer], 'get') else None
    if moe and 'expert_weights' in moe:
      out[layer] = moe['expert_weights'][0]
  return out


def per_image(weights: Array, batch_size: int, num_tokens: int) -> Array:
  """(G, S, E) -> (B, N, E): tokens back in image order, group padding dropped."""
  e = weights.shape[-1]
  return weights.reshape(-1, e)[:batch_size * num_tokens].reshape(batch_size, num_tokens, e)


def assignments(weights: Array) -> tuple[Array, Array]:
  """(B, N, E) weights -> experts (B, N, K) int32 and weights (B, N, K) float32, K = E.

  Each token's experts in decreasing weight (ties to the lower index), then -1 with
  weight 0 for the experts it was not dispatched to.
  """
  values, index = jax.lax.top_k(weights, weights.shape[-1])
  dispatched = values > 0
  return (jnp.where(dispatched, index, -1).astype(jnp.int32),
          jnp.where(dispatched, values, 0).astype(jnp.float32))


def routing_sums(weights: Array, mask: Array) -> dict[str, Array]:
  """Counts over the real examples (mask (B,) True) of one batch; weights (B, N, E)."""
  real = jnp.broadcast_to(mask[:, None], weights.shape[:2])                # (B, N)
  dispatched = (weights > 0) & real[..., None]                             # (B, N, E)
  counts = token_counts(jnp.sum(dispatched, axis=-1, dtype=jnp.int32), real)
  return {
      'tokens': counts['tokens'],
      'dropped': counts['with_0'],
      'with_1': counts['with_1'],
      'with_2plus': counts['with_2plus'],
      'expert_tokens': jnp.sum(dispatched, axis=(0, 1), dtype=jnp.int32),   # (E,)
  }


def summarize(sums: Mapping[str, Any]) -> dict[str, Any]:
  """Fractions from `routing_sums` added over an eval set (host values)."""
  tokens = int(sums['tokens'])
  expert_tokens = np.asarray(sums['expert_tokens'], np.int64)
  denominator = max(tokens, 1)
  return {
      'num_tokens': tokens,
      'dropped_fraction': int(sums['dropped']) / denominator,
      'tokens_with_1_expert': int(sums['with_1']) / denominator,
      'tokens_with_2plus_experts': int(sums['with_2plus']) / denominator,
      'experts_per_token': float(expert_tokens.sum()) / denominator,
      'expert_load': [float(v) / denominator for v in expert_tokens],
      'expert_tokens': [int(v) for v in expert_tokens],
  }
