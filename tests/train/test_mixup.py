"""config.mixup: hand-made batches mixed with their rolls, per batch, device shard or
example, of 2 or 3 examples; the weights from the step key."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import losses
from vmoe_sparse_ot.train import mixup
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train import step as step_lib
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
  step = jax.jit(step_lib.make_step(Linear(), optax.sgd(0.1), loss='sigmoid_xent',
                                   mixup=mixup.Mixup(0.5)))
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
  _, plain = jax.jit(step_lib.make_step(Linear(), optax.sgd(0.1), loss='sigmoid_xent'))(
      state, BATCH)
  logits = IMAGES.reshape(4, -1) @ np.asarray(state.params['w'])
  assert float(plain['cross_entropy']) == pytest.approx(
      np.asarray(losses.sigmoid_xent(logits, BATCH)).mean(), rel=1e-5)


def test_default_is_bit_identical_to_the_single_ratio_mixup():
  # The mixup of the configs that predate granularity and size, written out:
  # one folded Beta(p, p) scalar, x r + x rolled by one (1 - r).
  def before(key, batch, p):
    r = jax.random.beta(key, p, p, dtype=jnp.float32)
    r = jnp.maximum(r, 1.0 - r)
    return {k: r * v + (1 - r) * jnp.roll(v, 1, axis=0) if k in ('image', 'labels') else v
            for k, v in batch.items()}

  key = jax.random.key(1)
  want = jax.jit(lambda k, b: before(k, b, 0.2))(key, BATCH)
  got = jax.jit(lambda k, b: mixup.mixup(k, b, 0.2))(key, BATCH)
  assert 0.5 < float(want['labels'][0, 0]) < 0.99  # A real mix.
  for name in ('image', 'labels'):
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]))


X = np.arange(8, dtype=np.float32)[:, None] * 10  # Example j holds 10 j.


def test_hand_weighted_mixes_of_2_and_3_examples_per_granularity():
  # 'batch', size 2: one weight; example j takes 1/4 of example j - 1 (cyclic over 8).
  out = mixup.mix(X, np.array([0.75, 0.25]).reshape(2, 1, 1))
  np.testing.assert_allclose(out[:, 0], [0.75 * 10 * j + 0.25 * 10 * ((j - 1) % 8)
                                         for j in range(8)], rtol=1e-6)
  # 'device', size 2, 2 shards of 4: shard 0 with 0.75, shard 1 with 0.6, each rolled
  # on its own (example 4 takes from example 7, not 3).
  w0 = np.array([0.75, 0.6]).reshape(1, 2, 1)
  out = mixup.mix(X, np.concatenate([w0, 1 - w0]), num_groups=2)
  previous = [3, 0, 1, 2, 7, 4, 5, 6]
  ratio = [0.75] * 4 + [0.6] * 4
  np.testing.assert_allclose(out[:, 0], [r * 10 * j + (1 - r) * 10 * previous[j]
                                         for j, r in enumerate(ratio)], rtol=1e-6)
  # 'example', size 2, 2 shards: each example its own weight.
  r = np.linspace(0.5, 0.95, 8, dtype=np.float32)
  w0 = r.reshape(1, 2, 4)
  out = mixup.mix(X, np.concatenate([w0, 1 - w0]), num_groups=2)
  np.testing.assert_allclose(out[:, 0], [r[j] * 10 * j + (1 - r[j]) * 10 * previous[j]
                                         for j in range(8)], rtol=1e-6)
  # Size 3, 'batch': example j = 0.5 x_j + 0.3 x_{j-1} + 0.2 x_{j-2}, cyclic over 8.
  w = np.array([0.5, 0.3, 0.2], np.float32)
  out = mixup.mix(X, w.reshape(3, 1, 1))
  np.testing.assert_allclose(out[:, 0], [10 * (0.5 * j + 0.3 * ((j - 1) % 8) +
                                               0.2 * ((j - 2) % 8)) for j in range(8)],
                             rtol=1e-6)
  # Size 3, 'device' with 2 shards: the rolls stay within each shard of 4.
  w = np.array([[0.5, 0.7], [0.3, 0.2], [0.2, 0.1]], np.float32).reshape(3, 2, 1)
  out = mixup.mix(X, w, num_groups=2)
  want = []
  for j in range(8):
    g, i = divmod(j, 4)
    want.append(sum(w[k, g, 0] * 10 * (4 * g + (i - k) % 4) for k in range(3)))
  np.testing.assert_allclose(out[:, 0], want, rtol=1e-6)


def _one_hot_batch(n=8):
  """Example j: image 10 j + (0, 1) and 'labels' one-hot at class j, so a mixed
  example's labels name the examples it combines and their weights."""
  labels = np.eye(n, dtype=np.float32)
  image = np.stack([np.arange(n) * 10, np.arange(n) * 10 + 1], -1).astype(np.float32)
  return {'image': image, 'label': np.arange(n), 'labels': labels}


def _weights_of(out, size, shard):
  """(8, size) weights read off the mixed labels: example j's weight on the example
  i places before it within its shard of `shard` examples; checks nothing else mixed."""
  labels = np.asarray(out['labels'])
  w = np.zeros((8, size), np.float32)
  for j in range(8):
    g, i = divmod(j, shard)
    sources = [shard * g + (i - k) % shard for k in range(size)]
    w[j] = labels[j, sources]
    np.testing.assert_allclose(np.delete(labels[j], sources), 0)
  return w


@pytest.mark.parametrize('size', [2, 3])
@pytest.mark.parametrize('granularity', ['batch', 'device', 'example'])
def test_drawn_weights_per_granularity(granularity, size):
  batch = _one_hot_batch()
  key = jax.random.key(7)
  shape = mixup.weights_shape(granularity, 1 if granularity == 'batch' else 2, 8)
  out, drawn = jax.jit(lambda k: (
      mixup.mixup(k, batch, 0.5, granularity=granularity, size=size, num_shards=2),
      mixup.mix_weights(k, 0.5, shape, size)))(key)
  # 'batch' rolls the whole batch (shard of 8); the others within shards of 4.
  shard = 8 if granularity == 'batch' else 4
  w = _weights_of(out, size, shard)
  np.testing.assert_allclose(w.sum(1), 1, rtol=1e-6)
  assert (np.diff(w, axis=1) <= 0).all()  # The example's own weight is the largest.
  # The images are mixed with the same weights as the labels.
  image = batch['image']
  for j in range(8):
    g, i = divmod(j, shard)
    want = sum(w[j, k] * image[shard * g + (i - k) % shard] for k in range(size))
    np.testing.assert_allclose(out['image'][j], want, rtol=1e-5)
  np.testing.assert_array_equal(out['label'], batch['label'])
  distinct = len(np.unique(w[:, 0]))
  if granularity == 'batch':
    assert distinct == 1
  elif granularity == 'device':  # Constant within each shard of 4, 2 different ones.
    np.testing.assert_array_equal(w[:4], w[[0] * 4])
    np.testing.assert_array_equal(w[4:], w[[4] * 4])
    assert distinct == 2
  else:
    assert distinct == 8
  # The weights are those mix_weights draws with the key.
  drawn = np.asarray(drawn).reshape(size, -1).T
  np.testing.assert_allclose(np.unique(w, axis=0), np.unique(drawn, axis=0), rtol=1e-6)


def test_dirichlet_weights_of_3_examples():
  keys = jax.random.split(jax.random.key(1), 128)
  for p in (0.05, 1.0):
    w = np.asarray(jax.vmap(lambda k, p=p: mixup.mix_weights(k, p, (), 3))(keys))
    assert w.shape == (128, 3) and np.isfinite(w).all()
    np.testing.assert_allclose(w.sum(1), 1, rtol=1e-5)
    assert (np.diff(w, axis=1) <= 0).all() and w[:, 0].min() >= 1 / 3 - 1e-6
  # Small p: nearly every example keeps (almost) all of itself.
  w = np.asarray(jax.vmap(lambda k: mixup.mix_weights(k, 0.01, (), 3))(keys))
  assert np.mean(w[:, 0] > 0.99) > 0.9


def test_device_granularity_mixes_within_each_devices_shard_of_the_mesh():
  """The train step on a 4-device mesh: one ratio per device's shard, no example
  crossing devices, and the loss of the batch mixed so by hand."""
  mesh = parallel.make_mesh({'data': -1, 'expert': 1}, jax.devices()[:4])
  batch = _one_hot_batch()
  sharding = parallel.batch_sharding(mesh)
  with jax.set_mesh(mesh):
    sharded = jax.device_put(batch, sharding)
    out = jax.jit(lambda k, b: mixup.mixup(
        k, b, 0.5, granularity='device', num_shards=mixup.mesh_shards(parallel.AXES)))(
            jax.random.key(3), sharded)
  assert mixup.mesh_shards(parallel.AXES) == 1  # No mesh outside.
  w = _weights_of(jax.device_get(out), 2, 2)
  ratios = []
  for shard in out['labels'].addressable_shards:  # Each device's 2 examples.
    rows = np.asarray(shard.data)
    start = shard.index[0].start
    r = w[start:start + 2, 0]
    assert r[0] == r[1] and rows[:, start:start + 2].sum() == pytest.approx(2, rel=1e-6)
    ratios.append(float(r[0]))
  assert len(set(ratios)) == 4 and min(ratios) >= 0.5
  # The train step mixes the same way under the mesh.
  step = step_lib.make_step(Linear(), optax.sgd(0.1), loss='sigmoid_xent',
                           mixup=mixup.Mixup(0.5, 'device', 3))
  state = state_lib.create({'w': jax.random.normal(jax.random.key(0), (2, 8))},
                           optax.sgd(0.1), jax.random.key(1))
  with jax.set_mesh(mesh):
    _, values = jax.jit(step)(state, sharded)
  mixup_key, _ = jax.random.split(jax.random.fold_in(state.key, 1))
  mixed = mixup.mixup(mixup_key, batch, 0.5, granularity='device', size=3, num_shards=4)
  logits = np.asarray(mixed['image']) @ np.asarray(state.params['w'])
  want = np.asarray(losses.sigmoid_xent(logits, mixed)).mean()
  assert float(values['cross_entropy']) == pytest.approx(want, rel=1e-5)
