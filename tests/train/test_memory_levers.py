"""model.remat and model.dtype: same gradients, float32 parameters and logits, training."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.nn.helpers import tiny_config
from vmoe_sparse_ot import nn
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train import run_record
from vmoe_sparse_ot.train import step as step_lib


def _model(**keys):
  cfg = tiny_config()            # D 16, 8x8 images
  cfg.encoder.num_layers = 1     # one MoE block: one small compilation per test
  cfg.encoder.moe.layers = '0'
  cfg.update(keys)
  return nn.build_model(cfg)


def _batch(b=8, seed=0):
  rng = np.random.default_rng(seed)
  return {'image': rng.normal(size=(b, 8, 8, 3)).astype(np.float32),
          'label': rng.integers(0, 3, size=b)}


def _params(model, batch):
  init = jax.jit(lambda k: model.init({'params': k}, batch['image'][:1], train=False))
  params = init(jax.random.key(0))['params']
  # The head starts at zero; a random one lets every parameter get a gradient.
  head = params['head']['kernel']
  params['head']['kernel'] = 0.5 * jax.random.normal(jax.random.key(1), head.shape)
  return params


def _grads(model, params, batch):
  def loss(p):
    logits, aux = model.apply({'params': p}, batch['image'], train=True,
                              rngs={'dropout': jax.random.key(2), 'gating': jax.random.key(3)})
    labels = jax.nn.one_hot(batch['label'], logits.shape[-1])
    return optax.softmax_cross_entropy(logits, labels).mean() + aux['auxiliary_loss']
  return jax.jit(jax.grad(loss))(params)


def test_remat_gives_the_same_gradients_and_parameters():
  batch = _batch()
  plain, remat = _model(), _model(remat=True)
  params = _params(plain, batch)
  shapes = lambda m: jax.eval_shape(
      lambda: m.init({'params': jax.random.key(0)}, batch['image'][:1], train=False))
  assert shapes(remat) == shapes(plain)
  g0, g1 = _grads(plain, params, batch), _grads(remat, params, batch)
  for name, a in jax.tree_util.tree_leaves_with_path(g0):
    b = dict(jax.tree_util.tree_leaves_with_path(g1))[name]
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=str(name))
  assert float(optax.tree.norm(g0['encoder']['encoderblock_0']['moe'])) > 0


def test_bfloat16_keeps_float32_params_and_logits_close_to_float32():
  batch = _batch()
  f32, bf16 = _model(), _model(dtype='bfloat16')
  params = _params(bf16, batch)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  forward = lambda m: jax.jit(lambda p, x: m.apply({'params': p}, x, train=False)[0])
  want = forward(f32)(params, batch['image'])
  got = forward(bf16)(params, batch['image'])
  assert got.dtype == jnp.float32 and np.isfinite(got).all()
  np.testing.assert_allclose(got, want, atol=0.1 * float(jnp.abs(want).max()))


@pytest.mark.parametrize('keys', [{'dtype': 'bfloat16'}, {'remat': True}],
                         ids=['bfloat16', 'remat'])
def test_trains_a_few_steps(keys):
  model = _model(**keys)
  batch = _batch(16)
  params = _params(model, batch)
  tx = optax.adam(3e-3)
  state = state_lib.create(params, tx, jax.random.key(1))
  step = jax.jit(step_lib.make_step(model, tx))
  losses = []
  for _ in range(4):
    state, values = step(state, batch)
    losses.append(float(values['loss']))
  assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
  assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}


def test_config_errors_name_the_key():
  config = config_lib.load_config_file('configs/vmoe_tiny_mnist.py').to_dict()
  for key, value in [('dtype', 'float16'), ('remat', 1)]:
    bad = {**config, 'model': {**config['model'], key: value}}
    with pytest.raises(ValueError, match=f'model.{key}'):
      config_lib.validate(bad)
    with pytest.raises(ValueError, match=f'model.{key}'):
      nn.build_model(bad['model'])


def test_checkpoints_resume_and_evaluate_across_compute_keys():
  config = config_lib.load_config_file('configs/vmoe_tiny_mnist.py')
  # The default config's record leaves the compute keys out at their defaults; a
  # record written before they existed lacks them, and says implementation='fast'
  # (every record before 'auto' did), which is not compared either.
  now = config.model.to_dict()
  assert run_record.make(config, {})['model_config'] == run_record.as_json(
      run_record.without_compute_keys(now, only_defaults=True))
  old = run_record.as_json(run_record.without_compute_keys(now))
  old['encoder']['moe']['router']['sparse_ot']['implementation'] = 'fast'
  config.model.remat, config.model.dtype = True, 'bfloat16'
  assert run_record.model_config_differences(old, config.model) == []
  run_record.check_compatible({'model_config': old}, run_record.make(config, {})['model_config'],
                               {}, 'dir')
  config.model.hidden_size += 8   # Other keys are still compared.
  diffs = run_record.model_config_differences(old, config.model)
  assert [d.split(':')[0] for d in diffs] == ['model.hidden_size']
