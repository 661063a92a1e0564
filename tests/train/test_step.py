"""train.step: one plain train step (no mixup, one microstep, a stateless model) against
the gradient written out by hand. Mixup, microsteps and a router's state in the step:
test_mixup.py, test_microsteps.py, test_model_state.py."""
import jax
import numpy as np
import optax
import pytest

from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train import step as step_lib
from tests.train.test_losses import Linear

IMAGES = np.array([[1.0, 0.0, 2.0, -1.0], [0.5, 1.0, 0.0, 3.0]], np.float32).reshape(2, 2, 2, 1)
LABEL = np.array([2, 1])   # the first misclassified (argmax 0), the second not
W = np.array([[0.1, -0.2, 0.3], [0.0, 0.4, -0.1], [0.2, 0.1, 0.0], [-0.3, 0.2, 0.1]],
             np.float32)


def test_one_sgd_step_by_hand():
  state = state_lib.create({'w': W}, optax.sgd(0.5), jax.random.key(0))
  step = jax.jit(step_lib.make_step(Linear(), optax.sgd(0.5)))
  new, values = step(state, {'image': IMAGES, 'label': LABEL})
  # Softmax cross-entropy of logits x @ W, mean over the batch of 2; its gradient
  # x^T (softmax - onehot) / 2; SGD moves W by -0.5 times it.
  x = IMAGES.reshape(2, 4).astype(np.float64)
  logits = x @ W
  p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  onehot = np.eye(3)[LABEL]
  loss = -np.log(p[np.arange(2), LABEL]).mean()
  grad = x.T @ (p - onehot) / 2
  np.testing.assert_allclose(new.params['w'], W - 0.5 * grad, rtol=1e-5, atol=1e-7)
  assert values == pytest.approx({
      'loss': loss, 'cross_entropy': loss, 'auxiliary_loss': 0.0,
      'accuracy': 0.5, 'grad_norm': np.sqrt((grad ** 2).sum())},
      rel=1e-5)
  assert int(new.step) == 1 and new.model_state == {}
  np.testing.assert_array_equal(new.rng, state.rng)   # the root key stays; steps fold it in
  assert int(step(new, {'image': IMAGES, 'label': LABEL})[0].step) == 2
