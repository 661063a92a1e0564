"""config.microsteps: M accumulated microbatches make the update of the full batch."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.train import microsteps as microsteps_lib
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train import step as step_lib
from tests.train.helpers import small_config

BATCH = 32


def _batch(seed):
  rng = np.random.default_rng(seed)
  return {'image': rng.uniform(size=(BATCH, 28, 28, 1)).astype(np.float32),
          'label': rng.integers(0, 10, size=BATCH)}


def _state(model_config, tx, seed):
  model = nn.build_model(model_config)

  @jax.jit
  def init(key):  # One program (eagerly, each op of init compiles on its own).
    params = model.init({'params': key}, jnp.zeros((1, 28, 28, 1)), train=False)['params']
    return state_lib.create(params, tx, jax.random.key(seed + 1))
  return model, init(jax.random.key(seed))


def test_split_is_strided_and_covers_the_batch_once():
  batch = {'x': np.arange(12 * 2).reshape(12, 2)}
  micro = microsteps_lib.split(batch, 3)['x']
  assert micro.shape == (3, 4, 2)
  np.testing.assert_array_equal(micro[1, :, 0], [2, 8, 14, 20])  # Examples 1, 4, 7, 10.
  np.testing.assert_array_equal(np.sort(np.asarray(micro).reshape(-1)), np.arange(24))
  with pytest.raises(ValueError, match='microsteps=5 must divide'):
    microsteps_lib.split(batch, 5)


def test_gradients_and_metrics_are_averaged_and_totals_summed():
  """Totals (a stateful router's token counts, `nn.router_state`) add up over the
  microbatches, so the router's once-per-step update sees the whole batch's."""
  def grad_fn(params, batch, key):
    del key
    x = batch['x']
    return params * jnp.sum(x), {'m': jnp.mean(x)}, {'load': jnp.sum(x, dtype=jnp.int32)}

  batch = {'x': jnp.arange(8, dtype=jnp.int32)}
  grads, metrics, totals = jax.jit(lambda p, b: microsteps_lib.accumulate(
      grad_fn, p, b, jax.random.key(0), 2))(jnp.float32(2.0), batch)
  assert float(grads) == 2.0 * 28 / 2 and float(metrics['m']) == 3.5
  assert int(totals['load']) == 28 and totals['load'].dtype == jnp.int32


def test_four_microsteps_on_eight_devices_give_the_full_batch_update_on_one():
  # The MoE groups are one image each (17 tokens), so a microbatch routes every
  # token as the full batch does; no dropout and no gating noise. Two batches
  # (seeds) through the same two compiled steps.
  config = small_config('router=topk', model__encoder__moe__group_size=17,
                        model__encoder__moe__router__noise_std=0.0)
  tx = optax.sgd(0.5)  # The update is the gradient itself, scaled.
  model, state = _state(config.model, tx, 0)
  full_step = jax.jit(step_lib.make_step(model, tx))
  mesh = parallel.make_mesh({'data': -1, 'expert': 2}, jax.devices()[:8], 4)
  with jax.set_mesh(mesh):
    micro_step = jax.jit(step_lib.make_step(model, tx, microsteps=4))
  for seed in (0, 1):
    batch = _batch(seed)
    full, full_values = full_step(state, batch)
    with jax.set_mesh(mesh):
      micro, micro_values = micro_step(
          state, jax.device_put(batch, parallel.batch_sharding(mesh)))
    assert int(micro.step) == int(full.step) == 1
    for a, b in zip(jax.tree.leaves(micro.params), jax.tree.leaves(full.params)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    for name in ('loss', 'cross_entropy', 'accuracy', 'grad_norm', 'auxiliary_loss'):
      np.testing.assert_allclose(float(micro_values[name]), float(full_values[name]),
                                 rtol=2e-5)


@pytest.mark.parametrize('overrides,message', [
    ({'microsteps': 0}, 'config.microsteps=0'),
    ({'microsteps': 3}, 'config.microsteps=3: must divide config.batch_size=16'),
])
def test_bad_microsteps_are_one_line_naming_the_key(overrides, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(small_config(**overrides))


def test_microbatches_must_fill_every_device():
  config = small_config(microsteps=4)  # Microbatches of 4 examples on 8 devices.
  with pytest.raises(config_lib.ConfigError,
                     match=r'config.microsteps=4: leaves microbatches of 4 examples'):
    config_lib.validate_for_devices(config, num_devices=8)
