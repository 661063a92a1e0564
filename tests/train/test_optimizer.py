"""Schedules, decoupled weight decay, clipping, and partitioning of params/state."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.train import config as config_lib
from vmoe_sparse_ot.train import optimizer as opt
from vmoe_sparse_ot.train import partitioning


def _schedule(name, **kw):
  cfg = dict(name=name, peak_value=1.0, end_value=0.1, warmup_steps=10, decay_steps=None)
  cfg.update(kw)
  return opt.make_schedule(cfg, train_steps=110)


def test_schedules_warm_up_then_decay():
  linear = _schedule('warmup_linear_decay')
  np.testing.assert_allclose([linear(s) for s in (0, 5, 10, 60, 110)],
                             [0.0, 0.5, 1.0, 0.55, 0.1], rtol=1e-6)
  cosine = _schedule('warmup_cosine_decay')
  np.testing.assert_allclose([cosine(s) for s in (5, 10, 60, 110)],
                             [0.5, 1.0, 0.55, 0.1], rtol=1e-6)
  constant = _schedule('warmup_constant')
  np.testing.assert_allclose([constant(s) for s in (5, 100)], [0.5, 1.0])
  with pytest.raises(ValueError, match='schedule.name'):
    _schedule('step_decay')


def test_decoupled_weight_decay_on_kernels_only_and_clipping():
  params = {'dense': {'kernel': jnp.ones((2,)), 'bias': jnp.ones((2,))}}
  cfg = dict(config_lib.base_config().optimizer)
  cfg.update(name='adamw', weight_decay=0.5, gradient_clip_norm=None)
  tx = opt.make_optimizer(cfg, optax.constant_schedule(0.1), params)
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  # Zero gradient: Adam's step is 0, the kernel decays by lr * wd * w, the bias not.
  np.testing.assert_allclose(updates['dense']['kernel'], -0.05 * np.ones(2), rtol=1e-6)
  np.testing.assert_allclose(updates['dense']['bias'], 0.0)
  cfg.update(name='sgd', momentum=0.0, weight_decay=0.0, gradient_clip_norm=1.0)
  tx = opt.make_optimizer(cfg, optax.constant_schedule(1.0), params)
  grads = {'dense': {'kernel': jnp.full((2,), 30.0), 'bias': jnp.full((2,), 40.0)}}
  updates, _ = tx.update(grads, tx.init(params), params)
  assert float(optax.tree.norm(updates)) == pytest.approx(1.0, rel=1e-5)


def test_expert_params_split_over_expert_axis_and_state_on_mesh():
  config = config_lib.base_config()
  model = nn.build_model(config.model)
  abstract = jax.eval_shape(
      lambda k: model.init({'params': k, 'gating': k, 'dropout': k},
                           jnp.zeros((1, 28, 28, 1)), train=False)['params'],
      jax.random.key(0))
  mesh = partitioning.make_mesh({'data': -1, 'expert': 2})
  assert dict(mesh.shape) == {'data': 4, 'expert': 2}
  shardings = partitioning.param_shardings(mesh, abstract, [(nn.EXPERT_PARAMS_REGEX,
                                                             P('expert'))])
  experts = shardings['encoder']['encoderblock_1']['moe']['experts']
  assert all(s.spec == P('expert') for s in experts.values())
  assert shardings['encoder']['encoderblock_1']['moe']['router']['kernel'].spec == P()
  tx = opt.make_optimizer(config.optimizer, optax.constant_schedule(1e-3), abstract)
  state_shardings = partitioning.opt_state_shardings(tx, jax.eval_shape(tx.init, abstract),
                                                     shardings, mesh)
  mu = next(s for s in state_shardings if hasattr(s, 'mu')).mu  # The Adam state.
  assert mu['encoder']['encoderblock_1']['moe']['experts']['wi_kernel'].spec == P('expert')
  # optax's step count would land on device 0 alone; here it is replicated on the mesh.
  small = {'experts': jnp.ones((4, 3)), 'dense': jnp.ones((3,))}
  small_shardings = partitioning.param_shardings(mesh, small, [('experts', P('expert'))])
  small = jax.device_put(small, small_shardings)
  tx = opt.make_optimizer(config.optimizer, optax.constant_schedule(1e-3), small)
  state = jax.jit(tx.init, out_shardings=partitioning.opt_state_shardings(
      tx, jax.eval_shape(tx.init, small), small_shardings, mesh))(small)
  count = [x for x in jax.tree.leaves(state) if x.ndim == 0][0]
  assert count.sharding.mesh.shape == mesh.shape and count.sharding.spec == P()
  assert len(count.sharding.device_set) == 8
  with pytest.raises(ValueError, match='divide'):
    partitioning.make_mesh({'data': -1, 'expert': 3})
  assert dict(partitioning.make_mesh({'data': -1, 'expert': -1}, num_experts=4).shape) == {
      'data': 2, 'expert': 4}
