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

C (slots per expert) is `soft_moe.num_slots` (the reference SoftRouter's
`num_slots`; the Soft MoE recipe sets 1) or `capacity` if either is set, else
round(S * capacity_factor / E) (Python's round: halves to the even integer; below 1
is an error), as in the reference implementation.

`soft_moe.compute_similarity_metrics` (off by default; the reference's option,
on there unless a config turns it off) adds the reference's similarity metrics:
the cosine similarity between the combine weights of every pair of distinct
real tokens of a group ('combine_weights_similarity_{min,max,mean}') and
between the dispatch weights of every pair of distinct slots
('dispatch_weights_similarity_{min,max,mean}'), and the means over tokens of the
smallest combine weight and over slots of the smallest dispatch weight
('combine_weights_min_mean', 'dispatch_weights_min_mean'). The reference's
'mu_similarity_*' (between the slot vectors) are not computed here.
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
  num_slots: Optional[int] = base.option(
      None, "Slots per expert (C), as the reference SoftRouter's num_slots; None: "
      "`capacity`, else round(S * capacity_factor / E).", check=base.AT_LEAST_ONE)
  compute_similarity_metrics: bool = base.option(
      False, "Also report the cosine similarities between the combine weights of pairs "
      "of tokens and between the dispatch weights of pairs of slots (the reference's "
      "metrics; an (S, S) and an (EC, EC) product per group).")


def capacity(opts: SoftMoEOptions, group_size: int, num_experts: int) -> int:
  """Slots per expert."""
  for key, default in (("capacity_ceil_or_round", "ceil"), ("capacity_multiple_of", 4)):
    if getattr(opts, key) != default:  # The reference's Soft MoE has no such option.
      raise ValueError(f"model.encoder.moe.router.{key}={getattr(opts, key)!r} does not "
                       "apply to soft_moe, whose slots are round(S * capacity_factor / E) "
                       f"as the reference's Soft MoE has them; leave it at {default!r}")
  if opts.num_slots is not None:
    if opts.capacity is not None and opts.capacity != opts.num_slots:
      raise ValueError(f"model.encoder.moe.router.soft_moe.num_slots={opts.num_slots!r} and "
                       f"model.encoder.moe.router.capacity={opts.capacity!r} both set the "
                       "slots per expert; set one")
    return opts.num_slots
  if opts.capacity is not None:
    return opts.capacity
  # Python's round (halves to the even integer) and no fewer than one slot, as the
  # reference's compute_capacity(..., ceil_or_round='round', multiple_of=1).
  slots = int(round(group_size * opts.capacity_factor / num_experts))
  if slots < 1:
    raise ValueError(f"model.encoder.moe.router.capacity_factor={opts.capacity_factor!r} gives "
                     f"round({group_size} * {opts.capacity_factor} / {num_experts}) = {slots} "
                     "soft_moe slots per expert; it must give at least 1 (or set "
                     "soft_moe.num_slots)")
  return slots


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


def _cosine_pairs(x: Array, eps: float = 1e-9) -> Array:
  """(G, M, K) -> (G, M, M): cosine similarity between the rows of each group."""
  x = x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + eps)
  return jnp.einsum("gmk,gnk->gmn", x, x)


def _pair_stats(sim: Array, valid: Array, name: str) -> dict:
  """min, max and mean of sim (G, M, M) over the pairs i != j that `valid` (G, M) keeps."""
  m = sim.shape[-1]
  keep = valid[:, :, None] & valid[:, None, :] & ~jnp.eye(m, dtype=bool)[None]
  count = jnp.maximum(jnp.sum(keep), 1)
  return {f"{name}_similarity_min": jnp.min(jnp.where(keep, sim, jnp.inf)),
          f"{name}_similarity_max": jnp.max(jnp.where(keep, sim, -jnp.inf)),
          f"{name}_similarity_mean": jnp.sum(jnp.where(keep, sim, 0.0)) / count}


def similarity_metrics(dispatch: Array, combine: Array, token_mask: Array) -> dict:
  """The reference SoftRouter's similarity metrics over real tokens (see the module doc).

  dispatch, combine (G, S, E, C); token_mask (G, S). Padding tokens (dispatch and
  combine weights 0) take part in no pair and no minimum.
  """
  g, s, e, c = combine.shape
  mask = token_mask.astype(jnp.float32)
  num_real = jnp.maximum(jnp.sum(mask), 1.0)
  combine_flat = combine.reshape(g, s, e * c)
  dispatch_slots = jnp.swapaxes(dispatch.reshape(g, s, e * c), 1, 2)      # (G, EC, S)
  out = {
      "combine_weights_min_mean": jnp.sum(jnp.min(combine_flat, axis=-1) * mask) / num_real,
      "dispatch_weights_min_mean": jnp.mean(
          jnp.min(jnp.where(token_mask[:, None, :], dispatch_slots, jnp.inf), axis=-1)),
  }
  out.update(_pair_stats(_cosine_pairs(combine_flat), token_mask, "combine_weights"))
  out.update(_pair_stats(_cosine_pairs(dispatch_slots), jnp.ones((g, e * c), bool),
                         "dispatch_weights"))
  return out


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
  if opts.compute_similarity_metrics:
    metrics.update(similarity_metrics(dispatch, combine, token_mask))
  metrics = jax.tree.map(jax.lax.stop_gradient, metrics)
  return rt.SoftRouting(dispatch, combine, base.zero_loss(), metrics)


ROUTER = base.Router(name="soft_moe", options=SoftMoEOptions, route=route, capacity=capacity,
                     logits_module=logits_module,
                     needs_rng=lambda opts, train: train and opts.noise_std > 0,
                     exclusive=("num_slots", "compute_similarity_metrics"))
