"""'topk': the V-MoE TopK router (Riquelme et al. 2021, appendix A).

Softmax of the logits plus Gaussian noise (std noise_std / E, training only),
the top-K experts of each token, buffer slots in priority order (all first
choices before any second; by position, or by largest gate with
batch_priority). Combine weights are the noisy softmax gates.

Auxiliary losses, computed on each group independently and averaged over the
groups, as V-MoE does (its router vmaps them over groups):
- importance: CV^2 over experts of the sum over the group's tokens of the clean
  softmax gates;
- load (training with noise only): CV^2 over experts of the mean over tokens of
  P(expert in the token's top-K if the noise were drawn again), the Gaussian
  tail probability of the gap to the K-th largest noisy logit.
- gshard (`gshard_loss_weight`, 0 by default, as the reference's): the GShard
  loss E^2 mean_e(f_e m_e) with f_e the fraction of the group's tokens whose
  largest gate is expert e and m_e the mean gate of e, on the gates that route
  (noisy in training); only m_e carries a gradient. Reported as `gshard_loss`
  when its weight is > 0.
CV^2 is var / mean^2. Padding tokens do not count.
"""
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class TopKOptions(base.CommonOptions):
  # Top-level keys (kept where configs have always set them).
  noise_std: Optional[float] = base.option(
      1.0, "Gate noise in training, in units of 1/E: the Gaussian std is noise_std / E, "
      "as in the reference V-MoE (its default 1.0 gives 1/E); 0 disables it. None: 1.0.",
      check=base.NON_NEGATIVE, top_level=True)
  importance_loss_weight: float = base.option(0.005, "Weight of the importance loss.",
                                              check=base.NON_NEGATIVE, top_level=True)
  load_loss_weight: float = base.option(0.005, "Weight of the load loss.",
                                        check=base.NON_NEGATIVE, top_level=True)
  gshard_loss_weight: float = base.option(
      0.0, "Weight of the GShard loss (the reference's key and default).",
      check=base.NON_NEGATIVE, top_level=True)


def noise_std(opts: TopKOptions, num_experts: int) -> float:
  """The Gaussian std added to the logits in training: noise_std / E."""
  return base.gate_noise_std(opts.noise_std, num_experts)


def cv_squared(x: Array) -> Array:
  """Squared coefficient of variation var/mean^2 over the last axis (0 where mean = 0)."""
  mean = jnp.mean(x, axis=-1)
  return jnp.var(x, axis=-1) / jnp.where(mean == 0, 1.0, mean ** 2)


def _mean_over_groups(per_group: Array, token_mask: Array) -> Array:
  """Mean of (G,) values over the groups that hold at least one real token."""
  real = jnp.any(token_mask, axis=1).astype(per_group.dtype)
  return jnp.sum(per_group * real) / jnp.maximum(jnp.sum(real), 1.0)


def importance_loss(gates: Array, token_mask: Array) -> Array:
  """Mean over groups of CV^2 over experts of sum_s gates[g, s, :]. gates (G, S, E)."""
  importance = jnp.sum(gates * token_mask[..., None], axis=1)             # (G, E)
  return _mean_over_groups(cv_squared(importance), token_mask)


def gshard_loss(gates: Array, token_mask: Array) -> Array:
  """Mean over groups of E^2 mean_e(f_e m_e), gates (G, S, E): f_e the fraction of real
  tokens whose largest gate is e (no gradient), m_e the mean gate of e over them."""
  e = gates.shape[-1]
  mask = token_mask[..., None].astype(gates.dtype)
  count = jnp.maximum(jnp.sum(mask, axis=1), 1.0)                          # (G, 1)
  top1 = jax.nn.one_hot(jnp.argmax(gates, axis=-1), e, dtype=gates.dtype)  # (G, S, E)
  fraction = jnp.sum(top1 * mask, axis=1) / count                          # (G, E)
  mean_gate = jnp.sum(gates * mask, axis=1) / count                        # (G, E)
  per_group = jnp.mean(jax.lax.stop_gradient(fraction) * mean_gate, axis=-1) * e ** 2
  return _mean_over_groups(per_group, token_mask)


def load_loss(logits: Array, noisy_logits: Array, std: float, k: int,
              token_mask: Array) -> Array:
  """Mean over groups of CV^2 over experts of the mean P(expert in top-K). (G, S, E) inputs."""
  # The K-th largest noisy logit, picked with a one-hot product so that its
  # gradient stays local (as V-MoE does it).
  kth = jax.lax.top_k(noisy_logits, k)[1][..., -1]
  threshold = jnp.sum(jax.nn.one_hot(kth, logits.shape[-1], dtype=logits.dtype) * noisy_logits,
                      axis=-1, keepdims=True)
  p = 1.0 - jax.scipy.stats.norm.cdf((threshold - logits) / std)          # (G, S, E)
  mask = token_mask[..., None].astype(p.dtype)
  load = jnp.sum(p * mask, axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)   # (G, E)
  return _mean_over_groups(cv_squared(load), token_mask)


def route(logits: Array, token_mask: Array, opts: TopKOptions, capacity: int, train: bool,
          rng: Optional[Array]) -> rt.Routing:
  e = logits.shape[-1]
  k = min(opts.num_selected_experts, e)
  std = noise_std(opts, e)
  noisy = train and std > 0
  noisy_logits = logits + std * jax.random.normal(rng, logits.shape, logits.dtype) \
      if noisy else logits
  gates = jax.nn.softmax(noisy_logits, axis=-1)
  token_index, valid = base.assign_top_k(gates, token_mask, e, k, capacity, opts.batch_priority)
  imp = importance_loss(jax.nn.softmax(logits, axis=-1) if noisy else gates, token_mask)
  extra = {"importance_loss": jax.lax.stop_gradient(imp)}
  aux = opts.importance_loss_weight * imp
  # The load loss measures the noise's effect: only in training with noise, so
  # that eval never computes it.
  if noisy:
    load = load_loss(logits, noisy_logits, std, k, token_mask)
    aux = aux + opts.load_loss_weight * load
    extra["load_loss"] = jax.lax.stop_gradient(load)
  if opts.gshard_loss_weight > 0:
    gshard = gshard_loss(gates, token_mask)
    aux = aux + opts.gshard_loss_weight * gshard
    extra["gshard_loss"] = jax.lax.stop_gradient(gshard)
  return base.finish(gates, token_index, valid, aux, extra)


ROUTER = base.Router(name="topk", options=TopKOptions, route=route,
                     needs_rng=lambda opts, train: train and noise_std(opts, 1) > 0,
                     exclusive=("gshard_loss_weight",),
                     experts_per_token=base.top_k_per_token)
