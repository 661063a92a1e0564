"""Mixup (Zhang et al. 2018) of a training batch: `config.mixup.p`.

One ratio r per step (per global batch) is drawn from Beta(p, p) and folded to
r = max(r, 1 - r) >= 1/2; example i becomes r x_i + (1 - r) x_{i-1} (the batch
rolled by one), the same for the images and the float targets 'labels', so each
example keeps most of itself and its mixed targets still sum to what they summed
to. Folding the ratio matters for small p: Beta(p, p) is then near 0 or 1, and
without it half the steps would replace every example by its neighbour. The
integer 'label' is left as it is (the label of the larger part; training accuracy
reads it).

The key is the train step's (derived from the step number), so a resumed run
mixes exactly as an uninterrupted one. The batch is the global batch: the roll
crosses device boundaries, as rolling a batch held by one device would.
"""
from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp

# Batch entries that are mixed; the rest (the integer 'label') are kept.
MIXED = ('image', 'labels')


def mix_ratio(key: jax.Array, p: float) -> jax.Array:
  """A scalar r ~ Beta(p, p) folded into [1/2, 1]."""
  r = jax.random.beta(key, p, p, dtype=jnp.float32)
  return jnp.maximum(r, 1.0 - r)


def mix(x: jax.Array, ratio: jax.Array) -> jax.Array:
  """ratio * x + (1 - ratio) * x rolled by one along the batch axis (axis 0)."""
  ratio = ratio.astype(x.dtype)
  return ratio * x + (1 - ratio) * jnp.roll(x, 1, axis=0)


def mixup(key: jax.Array, batch: Mapping[str, jax.Array], p: float) -> dict[str, jax.Array]:
  """`batch` with its 'image' and 'labels' mixed by one ratio drawn with `key`."""
  if 'labels' not in batch:
    raise ValueError("mixup needs float targets 'labels' in the batch (the pp string adds "
                     "them with onehot(K, key='label', key_result='labels'))")
  ratio = mix_ratio(key, p)
  return {k: mix(v, ratio) if k in MIXED else v for k, v in batch.items()}
