"""config.loss: softmax_xent and sigmoid_xent against hand-computed values; precision@1."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot.train import periodic_eval
from vmoe_sparse_ot.train import losses

LOGITS = np.array([[2.0, 0.5, -1.0], [0.0, -3.0, 3.0], [1.0, 1.5, 0.2]], np.float32)
LABEL = np.array([0, 1, 1])
ONEHOT = np.eye(3, dtype=np.float32)[LABEL]


def _log_softmax(z):
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_sigmoid_xent_is_the_sum_over_classes_of_binary_cross_entropies():
  targets = np.array([[1, 0, 1], [0, 0, 0], [0.7, 0.3, 0]], np.float32)  # Multi-hot, none, mixed.
  got = np.asarray(losses.sigmoid_xent(LOGITS, {'labels': targets, 'label': LABEL}))
  p = 1 / (1 + np.exp(-LOGITS.astype(np.float64)))
  want = -(targets * np.log(p) + (1 - targets) * np.log(1 - p)).sum(-1)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  with pytest.raises(ValueError, match="sigmoid_xent needs float targets 'labels'"):
    losses.sigmoid_xent(LOGITS, {'label': LABEL})


def test_softmax_xent_on_one_hot_labels_equals_integer_labels():
  for smoothing in (0.0, 0.2):
    integer = np.asarray(losses.softmax_xent(LOGITS, {'label': LABEL}, smoothing))
    onehot = np.asarray(losses.softmax_xent(LOGITS, {'label': LABEL, 'labels': ONEHOT},
                                            smoothing))
    np.testing.assert_allclose(onehot, integer, rtol=1e-6)
  # Without 'labels' it is exactly the older cross_entropy (same code path).
  np.testing.assert_array_equal(np.asarray(losses.softmax_xent(LOGITS, {'label': LABEL})),
                                np.asarray(losses.cross_entropy(LOGITS, LABEL)))
  # Soft targets read from 'labels' (what mixup gives), not from 'label'.
  soft = np.array([[0.6, 0.4, 0], [0, 1, 0], [0.25, 0.25, 0.5]], np.float32)
  got = np.asarray(losses.softmax_xent(LOGITS, {'label': LABEL, 'labels': soft}))
  np.testing.assert_allclose(got, -(soft * _log_softmax(LOGITS)).sum(-1), rtol=1e-6)


def test_top1_is_against_the_integer_label_else_precision_at_1():
  # Top-1 classes: 0, 2, 1.
  np.testing.assert_array_equal(losses.top1_correct(LOGITS, {'label': LABEL}), [1, 0, 1])
  multi = np.array([[1, 0, 1], [1, 1, 0], [0, 0, 0]], np.float32)  # Row 3: no positives.
  np.testing.assert_array_equal(losses.top1_correct(LOGITS, {'labels': multi}), [1, 0, 0])
  smoothed = np.array([[0.9, 0.05, 0.05], [0.05, 0.05, 0.9], [0.9, 0.05, 0.05]], np.float32)
  np.testing.assert_array_equal(losses.top1_correct(LOGITS, {'labels': smoothed}), [1, 1, 0])


class Linear:
  """A stand-in for the model: logits = flattened image @ w, no auxiliary loss."""

  def apply(self, variables, images, train=False, rngs=None, mutable=False):
    """As flax's apply: with `mutable` collections, also their (here empty) values."""
    del train, rngs
    x = images.reshape(images.shape[0], -1)
    out = x @ variables['params']['w'], {'auxiliary_loss': jnp.zeros(())}
    return (out, {}) if mutable else out


def test_eval_step_sums_the_configured_loss_over_real_examples():
  images = LOGITS[:, :, None, None]  # With w = I, the logits are the images.
  params = {'w': np.eye(3, dtype=np.float32)}
  mask = np.array([True, True, False])
  integer = periodic_eval.make_eval_step(Linear())(params, {'image': images, 'label': LABEL,
                                                         'mask': mask})
  onehot = periodic_eval.make_eval_step(Linear())(params, {'image': images, 'labels': ONEHOT,
                                                        'mask': mask})
  want = -_log_softmax(LOGITS)[[0, 1], LABEL[:2]].sum()
  assert float(integer['loss_sum']) == pytest.approx(want, rel=1e-6)
  assert float(onehot['loss_sum']) == pytest.approx(want, rel=1e-6)
  assert float(integer['correct']) == float(onehot['correct']) == 1.0
  assert float(integer['count']) == 2.0
  sigmoid = periodic_eval.make_eval_step(Linear(), 'sigmoid_xent')(
      params, {'image': images, 'labels': ONEHOT, 'mask': mask})
  want = np.asarray(losses.sigmoid_xent(LOGITS, {'labels': ONEHOT}))[:2].sum()
  assert float(sigmoid['loss_sum']) == pytest.approx(want, rel=1e-6)


def test_unknown_loss_names_the_known_ones():
  with pytest.raises(ValueError, match=r"unknown loss 'xent'; known: \['sigmoid_xent', "
                                       r"'softmax_xent'\]"):
    losses.get('xent')


def test_label_smoothing_against_the_formula():
  logits = np.array([[2.0, 0.5, -1.0], [0.0, 0.0, 3.0]], np.float32)
  labels = np.array([0, 1])
  got = np.asarray(losses.cross_entropy(logits, labels, 0.3))
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target = np.full((2, 3), 0.3 / 3) + 0.7 * np.eye(3)[labels]
  np.testing.assert_allclose(got, -(target * logp).sum(-1), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(losses.cross_entropy(logits, labels)),
                             -logp[[0, 1], labels], rtol=1e-6)


# E³ (M = 2) on hand-made logits: rows b*M + m. Example 0's members give softmax
# (1/2, 1/2) and (3/4, 1/4); example 1's (1/5, 4/5) and (3/5, 2/5).
E3_LOGITS = np.log(np.array([[1, 1], [3, 1], [1, 4], [3, 2]], np.float32))
E3_LABEL = np.array([0, 1])


@jax.jit
def _e3_values(logits, label):
  """Every E³ quantity of the test below in one compiled program."""
  batch = {'label': label}
  log_p = losses.ensemble_log_probs(logits, 2)
  return (jnp.exp(log_p), losses.ensemble_softmax_xent(logits, batch, 2),
          losses.ensemble_softmax_xent(logits, {'labels': jax.nn.one_hot(label, 2)}, 2),
          losses.softmax_xent(logits, losses.repeat_targets(batch, 2)).mean(),
          losses.calibration_bins(log_p, batch, jnp.ones(label.shape, bool)))


def test_e3_mean_of_probabilities_and_its_losses_by_hand():
  mean, nll, nll_onehot, train, bins = _e3_values(E3_LOGITS, E3_LABEL)
  np.testing.assert_allclose(mean, [[5 / 8, 3 / 8], [2 / 5, 3 / 5]], rtol=1e-6)  # (1/2 + 3/4) / 2
  np.testing.assert_allclose(nll, [-np.log(5 / 8), -np.log(3 / 5)], rtol=1e-6)
  np.testing.assert_allclose(nll_onehot, nll, rtol=1e-6)  # Same against one-hot 'labels'.
  # Training: each member against the repeated labels, averaged over the 4 rows.
  np.testing.assert_allclose(
      train, -(np.log(1 / 2) + np.log(3 / 4) + np.log(4 / 5) + np.log(2 / 5)) / 4, rtol=1e-6)
  # ECE (15 bins): confidences 5/8 and 3/5 (both bin 9), both right: |0.6125 - 1|.
  assert losses.expected_calibration_error(bins) == pytest.approx(1 - (5 / 8 + 3 / 5) / 2)


def test_e3_sigmoid_ensemble_loss_by_hand():
  # Per class the members' sigmoids: sigmoid(log r) = r / (1 + r).
  z = np.log(np.array([[1, 1 / 3], [3, 1]], np.float32))   # one example, M = 2, 2 classes
  p = np.array([(1 / 2 + 3 / 4) / 2, (1 / 4 + 1 / 2) / 2])  # 5/8, 3/8
  got, log_p = jax.jit(lambda z, y: (
      losses.ensemble_sigmoid_xent(z, {'labels': y}, 2),
      losses.ensemble_log_probs(z, 2, 'sigmoid_xent')))(z, np.array([[1.0, 0.0]], np.float32))
  np.testing.assert_allclose(got, [-np.log(p[0]) - np.log(1 - p[1])], rtol=1e-6)
  np.testing.assert_allclose(np.exp(log_p), [p], rtol=1e-6)
