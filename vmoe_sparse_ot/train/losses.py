"""The classification losses the trainer can minimize, by name (`config.loss.name`).

Each loss maps the model's logits (B, K) and a batch to a per-example loss (B,).
A batch holds the integer class 'label' (B,) and, when the pp string adds them
(`onehot(K, key='label', key_result='labels')`), float targets 'labels' (B, K):
one-hot, multi-hot (several positive classes) or soft (smoothed or mixed by
mixup). A loss reads 'labels' when the batch has them, else 'label'.

- `softmax_xent`: -sum_k y_k log softmax(z)_k, the targets y summing to one
  (the default; on one-hot targets the same as on integer labels).
- `sigmoid_xent`: sum_k -(y_k log sigmoid(z_k) + (1 - y_k) log sigmoid(-z_k)),
  one independent binary problem per class (multi-label, as the V-MoE ImageNet-21k
  recipe trains); needs 'labels'. The batch loss is the mean over examples of
  this sum over classes.

Accuracy (`top1_correct`) is top-1 against the integer 'label' when the batch has
one, else precision@1: whether the top-1 class is one of the example's positive
classes (its largest target; an example without positives is never correct).
"""
from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

Batch = Mapping[str, jax.Array]
# (logits (B, K), batch, label_smoothing) -> per-example loss (B,).
LossFn = Callable[[jax.Array, Batch, float], jax.Array]


def cross_entropy(logits: jax.Array, labels: jax.Array, label_smoothing: float = 0.0):
  """Per-example softmax cross-entropy (B,) against integer labels, optionally smoothed."""
  if not label_smoothing:
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1]), label_smoothing)
  return optax.softmax_cross_entropy(logits, targets)


def softmax_xent(logits: jax.Array, batch: Batch, label_smoothing: float = 0.0) -> jax.Array:
  """Softmax cross-entropy (B,) against 'labels' if present, else the integer 'label'.

  `label_smoothing` s replaces the targets y by (1 - s) y + s / K.
  """
  if 'labels' not in batch:
    return cross_entropy(logits, batch['label'], label_smoothing)
  targets = batch['labels'].astype(logits.dtype)
  if label_smoothing:
    targets = optax.smooth_labels(targets, label_smoothing)
  return optax.softmax_cross_entropy(logits, targets)


def sigmoid_xent(logits: jax.Array, batch: Batch, label_smoothing: float = 0.0) -> jax.Array:
  """Sum over classes of the binary cross-entropy (B,) against 'labels' (B, K)."""
  if label_smoothing:  # Refused by the config checks; smooth with onehot(on=, off=).
    raise ValueError('label_smoothing applies to softmax_xent only')
  if 'labels' not in batch:
    raise ValueError("sigmoid_xent needs float targets 'labels' (B, K) in the batch; the pp "
                     "string adds them with onehot(K, key='label', key_result='labels')")
  targets = batch['labels'].astype(logits.dtype)
  return jnp.sum(optax.sigmoid_binary_cross_entropy(logits, targets), axis=-1)


LOSSES: dict[str, LossFn] = {
    'softmax_xent': softmax_xent,
    'sigmoid_xent': sigmoid_xent,
}
# Losses that read the float targets 'labels' only (never the integer 'label').
NEEDS_LABELS = ('sigmoid_xent',)


def get(name: str) -> LossFn:
  """The loss registered as `name`; ValueError naming the known ones otherwise."""
  if name not in LOSSES:
    raise ValueError(f'unknown loss {name!r}; known: {sorted(LOSSES)}')
  return LOSSES[name]


def top1_correct(logits: jax.Array, batch: Batch) -> jax.Array:
  """(B,) float 1.0 where the top-1 class is right (see the module docstring)."""
  top1 = jnp.argmax(logits, axis=-1)
  label = batch.get('label')
  if label is not None and label.ndim == 1:
    return (top1 == label).astype(jnp.float32)
  targets = batch['labels']
  picked = jnp.take_along_axis(targets, top1[:, None], axis=-1)[:, 0]
  best = jnp.max(targets, axis=-1)
  return ((picked == best) & (best > 0)).astype(jnp.float32)
