"""TrainState.model_state (topk_bias's bias): one update per optimizer step, a
checkpoint round trip, and a bit-exact resume. (That microsteps sum the load:
test_microsteps.py.)"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn import router_state
from vmoe_sparse_ot.train import checkpoints
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train import trainer
from tests.train.helpers import small_config

RATE = 0.01
BIAS = (router_state.STATE, 'encoder', 'encoderblock_0', 'moe', 'bias')


def _batch(seed, size=8):
  rng = np.random.default_rng(seed)
  return {'image': rng.uniform(size=(size, 28, 28, 1)).astype(np.float32),
          'label': rng.integers(0, 10, size=size)}


def _bias(state):
  tree = state.model_state
  for key in BIAS:
    tree = tree[key]
  return np.asarray(tree)


@pytest.fixture(scope='module')
def setup():
  # One block, an MoE one: the cheapest model that routes.
  config = small_config('router=topk_bias', model__encoder__num_layers=1,
                        model__encoder__moe__layers='0', model__encoder__moe__num_experts=8,
                        model__encoder__moe__router__topk_bias__update_rate=RATE)
  model = nn.build_model(config.model)
  tx = optax.sgd(0.1)

  @jax.jit
  def init(key):
    params, model_state = router_state.split(
        model.init({'params': key}, jnp.zeros((1, 28, 28, 1)), train=False))
    return state_lib.create(params, tx, jax.random.key(1), model_state)

  return model, tx, init(jax.random.key(0)), jax.jit(trainer.make_step(model, tx))


def test_bias_moves_once_per_step_by_the_load_of_the_batch(setup):
  model, _, state, step = setup
  np.testing.assert_array_equal(_bias(state), np.zeros(8))
  batch = _batch(0)
  # The load of the whole batch, by hand from the model's statistics.
  variables = router_state.with_state(state.params, state.model_state)
  _, out = jax.jit(lambda x: model.apply(variables, x, train=True,
                                         mutable=[router_state.STATISTICS]))(batch['image'])
  load = np.asarray(out[router_state.STATISTICS]['encoder']['encoderblock_0']['moe']['load'])
  assert load.sum() == 8 * 17 * 2                       # 8 images of 17 tokens, K = 2
  want = RATE * np.sign(load.mean() - load)
  assert np.any(want != 0)

  new, values = step(state, batch)
  np.testing.assert_allclose(_bias(new), want, rtol=1e-6)
  assert 'routing/encoderblock_0/selected_max_load_violation' in values


def test_checkpoint_round_trip_and_resume_are_bit_exact(setup, tmp_path):
  _, _, state, step = setup
  batches = [_batch(seed) for seed in range(4)]
  straight = state
  for batch in batches:
    straight, _ = step(straight, batch)

  half = state
  for batch in batches[:2]:
    half, _ = step(half, batch)
  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(2, half, {'step': 2})
  ckpt.close()
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'expert'))
  abstract = jax.eval_shape(lambda: half)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  restored, _ = checkpoints.Checkpointer(str(tmp_path)).restore(
      state_lib.with_shardings(abstract, jax.tree.map(lambda _: replicated, abstract)))
  assert restored.model_state and _bias(restored).any()
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(half)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert checkpoints.restore_model_state(str(tmp_path), 2).keys() == {router_state.STATE}

  resumed = restored
  for batch in batches[2:]:
    resumed, _ = step(resumed, batch)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(resumed)[0],
                          jax.tree.leaves(straight)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))
