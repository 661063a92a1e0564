"""config.mixup: a hand-made batch mixed with its roll; one ratio per step from the step key."""
import jax
import numpy as np
import optax
import pytest

from vmoe_sparse_ot.train import losses
from vmoe_sparse_ot.train import mixup
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train import trainer
from tests.train.test_losses import Linear

IMAGES = np.arange(4 * 2 * 2 * 1, dtype=np.float32).reshape(4, 2, 2, 1)
LABEL = np.array([0, 2, 1, 2])
BATCH = {'image': IMAGES, 'label': LABEL, 'labels': np.eye(3, dtype=np.float32)[LABEL]}


def test_mixup_of_a_hand_made_batch():
  key = jax.random.key(0)
  out = mixup.mixup(key, BATCH, 1.0)  # Beta(1, 1): uniform, folded.
  r = float(mixup.mix_ratio(key, 1.0))
  assert 0.6 < r < 0.9  # This key's ratio: a real mix.
  # Example i takes (1 - r) of example i - 1 (the batch rolled by one).
  previous = [3, 0, 1, 2]
  np.testing.assert_allclose(out['image'], r * IMAGES + (1 - r) * IMAGES[previous], rtol=1e-6)
  np.testing.assert_allclose(out['labels'][1], [1 - r, 0, r], rtol=1e-6)  # 2 mixed with 0.
  np.testing.assert_allclose(out['labels'], r * BATCH['labels'] + (1 - r) *
                             BATCH['labels'][previous], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(out['labels']).sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(out['image']).sum(), IMAGES.sum(), rtol=1e-6)
  np.testing.assert_array_equal(out['label'], LABEL)  # The larger part's label.
  with pytest.raises(ValueError, match="mixup needs float targets 'labels'"):
    mixup.mixup(key, {'image': IMAGES, 'label': LABEL}, 1.0)


def test_ratio_is_folded_above_one_half_and_fixed_by_the_key():
  keys = jax.random.split(jax.random.key(0), 256)
  for p in (0.01, 0.2, 5.0):
    ratios = np.asarray(jax.vmap(lambda k, p=p: mixup.mix_ratio(k, p))(keys))
    assert np.isfinite(ratios).all() and ratios.min() >= 0.5 and ratios.max() <= 1.0
  assert np.mean(np.asarray(jax.vmap(lambda k: mixup.mix_ratio(k, 0.01))(keys)) > 0.99) > 0.9
  assert float(mixup.mix_ratio(keys[0], 0.2)) == float(mixup.mix_ratio(keys[0], 0.2))
  assert float(mixup.mix_ratio(keys[0], 0.2)) != float(mixup.mix_ratio(keys[1], 0.2))


def _state(seed=0):
  params = {'w': jax.random.normal(jax.random.key(seed), (4, 3))}
  return state_lib.create(params, optax.sgd(0.1), jax.random.key(seed + 1))


def test_train_step_mixes_with_a_key_derived_from_the_step():
  step = jax.jit(trainer.make_step(Linear(), optax.sgd(0.1), loss='sigmoid_xent',
                                   mixup_p=0.5))
  state = _state()
  new, values = step(state, BATCH)
  # By hand: step 1 splits fold_in(key, 1) into (mixup key, model key).
  mixup_key, _ = jax.random.split(jax.random.fold_in(state.key, 1))
  mixed = mixup.mixup(mixup_key, BATCH, 0.5)
  logits = np.asarray(mixed['image']).reshape(4, -1) @ np.asarray(state.params['w'])
  want = np.asarray(losses.sigmoid_xent(logits, mixed)).mean()
  assert float(values['cross_entropy']) == pytest.approx(want, rel=1e-5)
  # The same state mixes the same way (a resumed run restores the state);
  # the next step draws another ratio.
  again, _ = step(state, BATCH)
  np.testing.assert_array_equal(np.asarray(again.params['w']), np.asarray(new.params['w']))
  _, later = step(new.replace(params=state.params), BATCH)
  assert float(later['cross_entropy']) != float(values['cross_entropy'])
  # p = 0: the batch as given, and the model keeps the whole step key.
  _, plain = jax.jit(trainer.make_step(Linear(), optax.sgd(0.1), loss='sigmoid_xent'))(
      state, BATCH)
  logits = IMAGES.reshape(4, -1) @ np.asarray(state.params['w'])
  assert float(plain['cross_entropy']) == pytest.approx(
      np.asarray(losses.sigmoid_xent(logits, BATCH)).mean(), rel=1e-5)
