"""TrainState.model_state (topk_bias's bias): one update per optimizer step, a
checkpoint round trip, and a bit-exact resume. (That microsteps sum the load:
test_microsteps.py.)"""
from typing import Any

import flax.linen as fnn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vmoe_sparse_ot.nn import router_state
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.moe import MoeLayer
from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train import step as step_lib

RATE = 0.01
E = 8
# Where jit puts the state; restored there, the compiled step serves it too.
DEVICE = jax.sharding.SingleDeviceSharding(jax.devices()[0])
BIAS = (router_state.STATE, 'moe', 'bias')


class TinyMoe(fnn.Module):
  """Images (B, 28, 28, 1) -> 16 patch tokens -> one MoE layer -> logits: the
  smallest model the train step takes (a ViT's outputs, a fraction of its compile)."""
  moe: Any   # MoeLayer kwargs, as VisionTransformer.moe (the trainer reads its router)

  @fnn.compact
  def __call__(self, images, train=False):
    b = images.shape[0]
    x = images.reshape(b, 4, 7, 4, 7).transpose(0, 1, 3, 2, 4).reshape(b, 16, 49)
    x = fnn.Dense(16)(x)
    y, aux, metrics = MoeLayer(mlp_dim=16, name='moe', **self.moe)(x, train)
    logits = fnn.Dense(10)(jnp.mean(x + y, axis=1))
    return logits, {'auxiliary_loss': aux, 'routing': {'moe': metrics}}


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
  router = routers.parse_router_options(
      {'name': 'topk_bias', 'topk_bias': {'update_rate': RATE}})
  model = TinyMoe(dict(num_experts=E, group_size=32, router=router))
  tx = optax.sgd(0.1)

  @jax.jit
  def init(key, images):
    """The step-0 state, and the load of `images` under it (one compilation for both)."""
    params, model_state = router_state.split(
        model.init({'params': key}, jnp.zeros((1, 28, 28, 1)), train=False))
    _, out = model.apply(router_state.with_state(params, model_state), images, train=True,
                         mutable=[router_state.STATISTICS])
    state = state_lib.create(params, tx, jax.random.key(1), model_state)
    return state, out[router_state.STATISTICS]['moe']['load']

  state, load = init(jax.random.key(0), _batch(0)['image'])
  return jax.device_put(state, DEVICE), np.asarray(load), jax.jit(step_lib.make_step(model, tx))


def test_bias_moves_once_per_step_by_the_load_of_the_batch(setup):
  state, load, step = setup
  np.testing.assert_array_equal(_bias(state), np.zeros(E))
  assert load.sum() == 8 * 16 * 2                       # 8 images of 16 tokens, K = 2
  want = RATE * np.sign(load.mean() - load)             # by hand, from batch 0's load
  assert np.any(want != 0)

  new, values = step(state, _batch(0))
  np.testing.assert_allclose(_bias(new), want, rtol=1e-6)
  assert 'routing/moe/selected_max_load_violation' in values


def test_checkpoint_round_trip_and_resume_are_bit_exact(setup, tmp_path):
  state, _, step = setup
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
  abstract = jax.eval_shape(lambda: half)
  restored, _ = checkpoints.Checkpointer(str(tmp_path)).restore(
      state_lib.with_shardings(abstract, jax.tree.map(lambda _: DEVICE, abstract)))
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


def test_on_8_devices_the_bias_is_replicated_global_and_restored(setup, tmp_path):
  """The trainer's shardings on a (data 2, expert 4) mesh: the bias is replicated,
  moves by the load of the whole global batch (as on one device), and a checkpoint
  restores it onto the same shardings."""
  if len(jax.devices()) < 8:
    pytest.skip('needs the 8 fake CPU devices of tests/conftest.py')
  from vmoe_sparse_ot import parallel  # pylint: disable=g-import-not-at-top
  state, _, one_device_step = setup
  mesh = parallel.make_mesh({'data': 2, 'expert': 4}, jax.devices()[:8], E)
  tx = optax.sgd(0.1)
  abstract = jax.eval_shape(lambda: state)
  shardings = state_lib.shardings_on_mesh(mesh, tx, abstract)
  assert all(s.spec == jax.sharding.PartitionSpec()
             for s in jax.tree.leaves(shardings.model_state))
  router = routers.parse_router_options(
      {'name': 'topk_bias', 'topk_bias': {'update_rate': RATE}})
  model = TinyMoe(dict(num_experts=E, group_size=32, router=router))
  step = jax.jit(step_lib.make_step(model, tx),
                 in_shardings=(shardings, parallel.batch_sharding(mesh)),
                 out_shardings=(shardings, parallel.replicated(mesh)))
  sharded = jax.device_put(state, shardings)
  with jax.set_mesh(mesh):
    new, _ = step(sharded, _batch(0))
  want, _ = one_device_step(state, _batch(0))
  np.testing.assert_allclose(_bias(new), _bias(want), rtol=1e-6)
  assert _bias(new).any()

  ckpt = checkpoints.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(1, new, {'step': 1})
  ckpt.close()
  restored, _ = checkpoints.Checkpointer(str(tmp_path)).restore(
      state_lib.with_shardings(abstract, shardings))
  bias = restored.model_state
  for key in BIAS:
    bias = bias[key]
  assert bias.sharding.is_equivalent_to(parallel.replicated(mesh), bias.ndim)
  np.testing.assert_array_equal(np.asarray(bias), _bias(new))
