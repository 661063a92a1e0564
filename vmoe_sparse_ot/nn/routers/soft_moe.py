"""'soft_moe': Soft MoE (Puigcerver et al. 2023, "From Sparse to Soft Mixtures of Experts").

Every expert has C slots; slot (e, c) has a learned vector mu[:, e, c]. With
tokens and slot vectors L2-normalised over D and a learned scalar scale, the
logits are l[g, s, e, c] = scale * <x[g, s], mu[:, e, c]> (plus Gaussian noise in
training if noise_std > 0). Then
- dispatch weights: softmax over the group's tokens S, per slot -- each slot
  processes a convex combination of the tokens;
- combine weights: softmax over all E*C slots, per token -- each token gets a
  convex combination of the slots' outputs.
Nothing is dropped and there is no auxiliary loss; gradients flow through both
softmaxes. Padding tokens get dispatch weight 0 and combine weight 0.

C (slots per expert) is `capacity` if set, else round(S * capacity_factor / E)
(at least 1), as in the reference implementation.
"""
import dataclasses
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SoftMoEOptions(base.CommonOptions):
  noise_std: float = base.option(0.0, "Std of the Gaussian noise added to the logits in "
                                 "training.", check=base.NON_NEGATIVE)


def capacity(opts: SoftMoEOptions, group_size: int, num_experts: int) -> int:
  """Slots per expert."""
  for key, default in (("capacity_ceil_or_round", "ceil"), ("capacity_multiple_of", 4)):
    if getattr(opts, key) != default:  # The reference's Soft MoE has no such option.
      raise ValueError(f"model.encoder.moe.router.{key}={getattr(opts, key)!r} does not "
                       "apply to soft_moe, whose slots are round(S * capacity_factor / E) "
                       f"as the reference's Soft MoE has them; leave it at {default!r}")
  if opts.capacity is not None:
    return opts.capacity
  return max(1, base.round_half_up(group_size * opts.capacity_factor / num_experts))


def _normalize(x: Array, axis: int, eps: float = 1e-6) -> Array:
  return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True) + eps)


class SoftMoELogits(nn.Module):
  """tokens (G, S, D) -> logits (G, S, E, C) against E*C learned slot vectors."""
  num_experts: int
  num_slots: int

  @nn.compact
  def __call__(self, x: Array) -> Array:
    mu = self.param("mu", nn.initializers.lecun_normal(),
                    (x.shape[-1], self.num_experts, self.num_slots))
    scale = self.param("scale", nn.initializers.ones, ())
    mu = _normalize(mu.astype(x.dtype), axis=0) * scale.astype(x.dtype)
    return jnp.einsum("gsd,dec->gsec", _normalize(x, axis=-1), mu)


def logits_module(opts: SoftMoEOptions, num_experts: int, capacity: int,
                  name: str) -> nn.Module:
  del opts
  return SoftMoELogits(num_experts, capacity, name=name)


def route(logits: Array, token_mask: Array, opts: SoftMoEOptions, capacity: int, train: bool,
          rng: Optional[Array]) -> rt.SoftRouting:
  del capacity
  if train and opts.noise_std > 0:
    logits = logits + opts.noise_std * jax.random.normal(rng, logits.shape, logits.dtype)
  real = token_mask[..., None, None]
  # Padding tokens get the lowest finite logit (exp underflows to 0 next to any
  # real token; no NaN even if a group had none).
  dispatch = jax.nn.softmax(jnp.where(real, logits, jnp.finfo(logits.dtype).min), axis=1)
  combine = jax.nn.softmax(logits, axis=(2, 3)) * real.astype(logits.dtype)
  mask = token_mask.astype(jnp.float32)
  num_real = jnp.maximum(jnp.sum(mask), 1.0)
  metrics = {
      "auxiliary_loss": base.zero_loss(),
      "dispatch_weights_max_mean": jnp.mean(jnp.max(dispatch, axis=1)),
      "combine_weights_max_mean": jnp.sum(jnp.max(combine, axis=(2, 3)) * mask) / num_real,
  }
  metrics = jax.tree.map(jax.lax.stop_gradient, metrics)
  return rt.SoftRouting(dispatch, combine, base.zero_loss(), metrics)


ROUTER = base.Router(name="soft_moe", options=SoftMoEOptions, route=route, capacity=capacity,
                     logits_module=logits_module,
                     needs_rng=lambda opts, train: train and opts.noise_std > 0)
