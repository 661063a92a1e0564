"""train.periodic_eval's eval step (the trainer's and the evaluate job's): the run's own loss."""
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot.train import periodic_eval


class FixedLogits:
  """A stand-in model: `apply` returns the given logits and no routing."""

  def __init__(self, logits):
    self.logits = jnp.asarray(logits, jnp.float32)

  def apply(self, variables, images, train, mutable=None):
    del variables, images, train
    return ((self.logits, {}), {}) if mutable else (self.logits, {})


def _batch(labels, mask):
  return {'image': jnp.zeros((len(labels), 2, 2, 3)), 'label': jnp.asarray(labels),
          'mask': jnp.asarray(mask)}


def _log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


@pytest.mark.parametrize('seed', [0, 1])
def test_sigmoid_run_is_scored_with_binary_cross_entropy_on_one_hot_labels(seed):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(5, 4)) * 3
  labels = rng.integers(0, 4, size=5)
  mask = np.array([True, True, False, True, True])
  out = periodic_eval.make_eval_step(FixedLogits(logits), 'sigmoid_xent', num_tokens=1)(
      None, _batch(labels, mask))
  y = np.eye(4)[labels]
  per_example = -(y * _log_sigmoid(logits) + (1 - y) * _log_sigmoid(-logits)).sum(-1)
  np.testing.assert_allclose(out['loss_sum'], per_example[mask].sum(), rtol=1e-5)
  assert int(out['correct']) == int(((logits.argmax(-1) == labels) & mask).sum())
  assert int(out['count']) == 4


def test_softmax_run_is_scored_as_before():
  logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 3.0]])
  out = periodic_eval.make_eval_step(FixedLogits(logits), num_tokens=1)(None, _batch([0, 1], [True, True]))
  log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(out['loss_sum'], -(log_softmax[0, 0] + log_softmax[1, 1]), rtol=1e-6)
  assert int(out['correct']) == 1


def test_float_targets_from_the_pp_string_are_used_as_given():
  logits = np.array([[1.0, -1.0, 0.5]])
  batch = {**_batch([0], [True]), 'labels': jnp.array([[0.9, 0.05, 0.05]])}
  out = periodic_eval.make_eval_step(FixedLogits(logits), 'sigmoid_xent', num_tokens=1)(None, batch)
  y = np.array([0.9, 0.05, 0.05])
  want = -(y * _log_sigmoid(logits[0]) + (1 - y) * _log_sigmoid(-logits[0])).sum()
  np.testing.assert_allclose(out['loss_sum'], want, rtol=1e-5)


@pytest.mark.parametrize('num_tokens', [None, 1])
def test_with_and_without_routing_the_sums_agree(num_tokens):
  """The trainer's step (no routing) and the job's (num_tokens) count the same."""
  logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 3.0], [1.0, 0.0, 0.0]])
  batch = _batch([0, 2, 1], [True, True, False])
  out = periodic_eval.make_eval_step(FixedLogits(logits), num_tokens=num_tokens)(None, batch)
  log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(out['loss_sum'], -(log_softmax[0, 0] + log_softmax[1, 2]),
                             rtol=1e-6)
  assert (int(out['correct']), int(out['count'])) == (2, 2)
  assert ('routing' in out) == (num_tokens is not None)
