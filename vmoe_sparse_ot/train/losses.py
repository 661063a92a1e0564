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

E³ ensembles (`model.ensemble_size` M > 1, `nn.ensemble`) give logits (B*M, K),
rows b*M .. b*M + M-1 for example b; the losses are the reference's ensemble
cross-entropies. In training each member is trained on its own, against the
targets repeated M times (`repeat_targets`): the loss is the mean over the B*M
rows of the loss above. In evaluation the members are combined by the mean of
their probabilities, p(y|x) = (1/M) sum_m p_m(y|x) (`ensemble_log_probs`, in log
space; softmax probabilities for softmax_xent, per-class sigmoid probabilities for
sigmoid_xent), and the loss is that mixture's negative log-likelihood
(`ENSEMBLE_EVAL_LOSSES`); the prediction is its top-1 class. `calibration_bins`
and `expected_calibration_error` give the ECE of any such probabilities.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
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


def repeat_targets(batch: Batch, ensemble_size: int) -> dict:
  """`batch` with 'label' and 'labels' repeated M times along the batch axis (the
  order of the ensemble's logits, `jnp.repeat`); other entries are left out."""
  return {k: jnp.repeat(batch[k], ensemble_size, axis=0)
          for k in ('label', 'labels') if k in batch}


def _normalizer(loss: str) -> Callable[[jax.Array], jax.Array]:
  if loss not in LOSSES:
    raise ValueError(f'unknown loss {loss!r}; known: {sorted(LOSSES)}')
  return jax.nn.log_sigmoid if loss == 'sigmoid_xent' else jax.nn.log_softmax


def ensemble_log_probs(logits: jax.Array, ensemble_size: int,
                       loss: str = 'softmax_xent') -> jax.Array:
  """(B*M, K) member logits -> (B, K) log of the members' mean probability.

  log((1/M) sum_m p_m) by logsumexp; p_m is softmax(z_m) for softmax_xent (the
  result is then a log-distribution over classes) and sigmoid(z_m) per class for
  sigmoid_xent.
  """
  normalize = _normalizer(loss)
  z = logits.reshape(-1, ensemble_size, logits.shape[-1])
  return jax.nn.logsumexp(normalize(z), axis=1) - jnp.log(float(ensemble_size))


def _xlogy_targets(targets: jax.Array, log_p: jax.Array) -> jax.Array:
  """targets * log_p, 0 where the target is 0 (even where log_p is -inf)."""
  return jnp.where(targets != 0, targets * jnp.where(targets != 0, log_p, 0.0), 0.0)


def ensemble_softmax_xent(logits: jax.Array, batch: Batch, ensemble_size: int) -> jax.Array:
  """(B,) -sum_k y_k log((1/M) sum_m softmax(z_m)_k): the ensemble's NLL, against
  'labels' if present, else the integer 'label'."""
  log_p = ensemble_log_probs(logits, ensemble_size, 'softmax_xent')
  if 'labels' not in batch:
    return -jnp.take_along_axis(log_p, batch['label'][:, None], axis=-1)[:, 0]
  return -jnp.sum(_xlogy_targets(batch['labels'].astype(log_p.dtype), log_p), axis=-1)


def ensemble_sigmoid_xent(logits: jax.Array, batch: Batch, ensemble_size: int) -> jax.Array:
  """(B,) sum_k -(y_k log p_k + (1 - y_k) log(1 - p_k)), p_k the members' mean
  sigmoid(z_mk), against 'labels' (B, K)."""
  if 'labels' not in batch:
    raise ValueError("sigmoid_xent needs float targets 'labels' (B, K) in the batch")
  log_p = ensemble_log_probs(logits, ensemble_size, 'sigmoid_xent')
  log_not_p = ensemble_log_probs(-logits, ensemble_size, 'sigmoid_xent')
  y = batch['labels'].astype(log_p.dtype)
  return -jnp.sum(y * log_p + (1.0 - y) * log_not_p, axis=-1)


# The evaluation loss of an ensemble trained with each loss: (logits (B*M, K),
# batch, M) -> (B,).
ENSEMBLE_EVAL_LOSSES = {
    'softmax_xent': ensemble_softmax_xent,
    'sigmoid_xent': ensemble_sigmoid_xent,
}

NUM_CALIBRATION_BINS = 15


def calibration_bins(log_probs: jax.Array, batch: Batch, mask: jax.Array,
                     num_bins: int = NUM_CALIBRATION_BINS) -> jax.Array:
  """(3, num_bins) sums over the real examples (mask True), binned by confidence:
  [examples, confidence, correct]. The confidence is the top-1 class's
  probability exp(max log_probs), in equal-width bins over [0, 1]; correct is
  `top1_correct`. Add them over batches, then `expected_calibration_error`."""
  confidence = jnp.exp(jnp.max(log_probs, axis=-1))
  correct = top1_correct(log_probs, batch)
  index = jnp.clip(jnp.floor(confidence * num_bins).astype(jnp.int32), 0, num_bins - 1)
  w = mask.astype(jnp.float32)
  rows = jnp.stack([w, w * confidence, w * correct])             # (3, B)
  return jnp.zeros((3, num_bins), jnp.float32).at[:, index].add(rows)


def expected_calibration_error(bins: Any) -> float:
  """ECE = sum over bins of |mean confidence - accuracy| weighted by the bin's share
  of the examples (Guo et al. 2017), from `calibration_bins` sums (host)."""
  count, confidence, correct = np.asarray(bins, np.float64)
  total = max(float(count.sum()), 1.0)
  return float(np.sum(np.abs(confidence - correct)) / total)
