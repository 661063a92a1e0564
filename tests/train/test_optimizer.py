"""Schedules, decoupled weight decay, clipping, and partitioning of params/state."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from vmoe_sparse_ot import nn
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.train import optimizer as opt
from vmoe_sparse_ot import parallel


def _schedule(name, **kw):
  """The schedule, jitted: called eagerly, each of its ops compiles as its own program."""
  cfg = dict(config_lib.base_config().schedule.to_dict(), name=name, peak_value=1.0,
             end_value=0.1, warmup_steps=10, decay_steps=None)
  cfg.update(kw)
  return jax.jit(opt.make_schedule(cfg, train_steps=110))


def _jitted(tx):
  """tx's init and update, each jitted into one program (eagerly, dozens of tiny ones)."""
  return jax.jit(tx.init), jax.jit(tx.update)


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


# The reference V-MoE code's schedules, written out by hand: peak 1, end 0.1, 10
# warmup steps, then 100 decay steps (the reference's decay_steps=110, counted
# from step 0); s = t - 10.
@pytest.mark.parametrize('name,kw,expected', [
    ('constant', {}, {0: 1.0, 5: 1.0, 60: 1.0, 110: 1.0}),
    # end + (peak - end) (1 - s / 100) ** 2
    ('warmup_polynomial_decay', {'power': 2.0},
     {5: 0.5, 10: 1.0, 60: 0.1 + 0.9 * 0.5 ** 2, 85: 0.1 + 0.9 * 0.25 ** 2, 110: 0.1}),
    # peak 0.5 ** (s / 20), not below end 0.1
    ('warmup_exponential_decay', {'transition_steps': 20, 'decay_rate': 0.5},
     {5: 0.5, 10: 1.0, 30: 0.5, 45: 0.5 ** 1.75, 70: 0.125, 110: 0.1}),
    ('warmup_exponential_decay', {'transition_steps': 20, 'decay_rate': 0.5,
                                  'staircase': True, 'end_value': 0.0},
     {10: 1.0, 45: 0.5, 110: 0.5 ** 5}),
    # peak / sqrt(1 + s / 25) until s = 80, then linear to 0 at s = 100
    ('big_vision_rsqrt', {'timescale': 25, 'cooldown_steps': 20},
     {5: 0.5, 10: 1.0, 35: 2 ** -0.5, 89: (1 + 79 / 25) ** -0.5, 90: 4.2 ** -0.5,
      100: 0.5 * 4.2 ** -0.5, 110: 0.0}),
    ('big_vision_rsqrt', {'timescale': 25, 'cooldown_steps': 0},
     {10: 1.0, 110: (1 + 100 / 25) ** -0.5}),
])
def test_reference_schedules_against_their_formulas(name, kw, expected):
  schedule = _schedule(name, decay_steps=100, **kw)
  got = [float(schedule(t)) for t in expected]
  np.testing.assert_allclose(got, list(expected.values()), rtol=1e-6, atol=1e-7)


def test_checkpoints_record_only_the_keys_their_schedule_reads():
  """Older checkpoints (five schedule keys) resume: the record of those schedules is
  unchanged by the keys other schedules added."""
  config = config_lib.base_config()
  record = config_lib.schedule_record(config.schedule)
  assert set(record) == {'name', 'peak_value', 'end_value', 'warmup_steps', 'decay_steps'}
  with config.unlocked():
    config.schedule.name = 'big_vision_rsqrt'
  assert set(config_lib.schedule_record(config.schedule)) == set(record) | {
      'timescale', 'cooldown_steps'}


def test_weight_decay_per_regex_takes_the_first_match_as_the_reference_does():
  params = {'encoder': {'kernel': jnp.full((2,), 2.0), 'bias': jnp.full((2,), 3.0)},
            'head': {'kernel': jnp.full((2,), 5.0)}}
  pairs = [('head/kernel', 0.5), ('kernel', 0.1)]   # the head matches both: the first wins
  factors = opt.weight_decay_factors(params, pairs)
  assert factors == {'encoder': {'kernel': 0.1, 'bias': 0.0}, 'head': {'kernel': 0.5}}
  cfg = dict(config_lib.base_config().optimizer.to_dict(), name='sgd', momentum=0.0,
             weight_decay=pairs)
  tx = opt.make_optimizer(cfg, optax.constant_schedule(1.0), params)
  grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(grads, jax.jit(tx.init)(params), params)
  # SGD at learning rate 1 on zero gradients: the update is -factor * param.
  np.testing.assert_allclose(updates['encoder']['kernel'], [-0.2, -0.2], rtol=1e-6)
  np.testing.assert_allclose(updates['encoder']['bias'], [0.0, 0.0])
  np.testing.assert_allclose(updates['head']['kernel'], [-2.5, -2.5], rtol=1e-6)


def test_param_naming_vmoe_matches_regexes_against_the_reference_names():
  """With param_naming='vmoe', weight decay and freezing read the reference V-MoE's
  names: our experts' wi_kernel is its Moe/Mlp/Dense_0/kernel, our attention its
  SelfAttention."""
  block = {'moe': {'experts': {'wi_kernel': jnp.full((2,), 2.0),
                               'wo_kernel': jnp.full((2,), 3.0)}},
           'attention': {'query': {'kernel': jnp.full((2,), 5.0)}}}
  params = {'encoder': {'encoderblock_1': block}}
  cfg = dict(config_lib.base_config().optimizer.to_dict(), name='sgd', momentum=0.0,
             weight_decay=[('Moe/Mlp/Dense_0/kernel', 0.5), ('.*/kernel', 0.1)],
             freeze='SelfAttention/', param_naming='vmoe')
  tx = opt.make_optimizer(cfg, optax.constant_schedule(1.0), params)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = jax.jit(tx.update)(grads, jax.jit(tx.init)(params), params)
  # SGD at learning rate 1: the update is -(grad + factor * param); frozen: 0.
  got = updates['encoder']['encoderblock_1']
  np.testing.assert_allclose(got['moe']['experts']['wi_kernel'], [-2.0, -2.0], rtol=1e-6)
  np.testing.assert_allclose(got['moe']['experts']['wo_kernel'], [-1.3, -1.3], rtol=1e-6)
  np.testing.assert_allclose(got['attention']['query']['kernel'], [0.0, 0.0])
  assert opt.frozen_names(params, 'SelfAttention/', 'vmoe') == [
      'encoder/encoderblock_1/attention/query/kernel']
  # In our naming none of these regexes matches the experts.
  assert opt.weight_decay_factors(params, cfg['weight_decay'])['encoder']['encoderblock_1'][
      'moe']['experts'] == {'wi_kernel': 0.0, 'wo_kernel': 0.0}


def test_frozen_gradients_count_in_the_clipping_norm_as_in_the_reference():
  """The reference zeroes frozen updates after the whole chain (clip, ..., learning
  rate): a frozen gradient of norm 5 beside a trained one of norm 1 clips the
  trained update to 1 / sqrt(26) of it at clip norm 1."""
  params = {'body': {'kernel': jnp.zeros((2,))}, 'head': {'kernel': jnp.zeros((2,))}}
  grads = {'body': {'kernel': jnp.array([3.0, 4.0])}, 'head': {'kernel': jnp.array([0.6, 0.8])}}
  cfg = dict(config_lib.base_config().optimizer.to_dict(), name='sgd', momentum=0.0,
             gradient_clip_norm=1.0, freeze='^body/')
  tx = opt.make_optimizer(cfg, optax.constant_schedule(1.0), params)
  updates, _ = jax.jit(tx.update)(grads, jax.jit(tx.init)(params), params)
  np.testing.assert_allclose(updates['body']['kernel'], [0.0, 0.0])
  np.testing.assert_allclose(updates['head']['kernel'], -np.array([0.6, 0.8]) / np.sqrt(26.0),
                             rtol=1e-6)


@pytest.mark.parametrize('value,message', [
    ([('kernel', -1.0)], "got the entry ('kernel', -1.0)"),
    ([('(kernel', 0.1)], "'(kernel' is not a regular expression"),
    ('0.1', 'must be a number >= 0 or a list of (regex, value >= 0) pairs'),
])
def test_bad_weight_decay_lists_are_one_line(value, message):
  config = config_lib.base_config()
  config.optimizer.weight_decay = value
  with pytest.raises(config_lib.ConfigError, match='config.optimizer.weight_decay=') as e:
    config_lib.validate(config)
  assert message in str(e.value) and '\n' not in str(e.value)


def test_decoupled_weight_decay_on_kernels_only_and_clipping():
  params = {'dense': {'kernel': np.ones((2,), np.float32), 'bias': np.ones((2,), np.float32)}}
  cfg = dict(config_lib.base_config().optimizer)
  cfg.update(name='adamw', weight_decay=0.5, gradient_clip_norm=None)
  init, update = _jitted(opt.make_optimizer(cfg, optax.constant_schedule(0.1), params))
  zero = jax.tree.map(np.zeros_like, params)
  updates, _ = update(zero, init(params), params)
  # Zero gradient: Adam's step is 0, the kernel decays by lr * wd * w, the bias not.
  np.testing.assert_allclose(updates['dense']['kernel'], -0.05 * np.ones(2), rtol=1e-6)
  np.testing.assert_allclose(updates['dense']['bias'], 0.0)
  cfg.update(name='sgd', momentum=0.0, weight_decay=0.0, gradient_clip_norm=1.0)
  init, update = _jitted(opt.make_optimizer(cfg, optax.constant_schedule(1.0), params))
  grads = {'dense': {'kernel': np.full((2,), 30.0, np.float32),
                     'bias': np.full((2,), 40.0, np.float32)}}
  updates, _ = update(grads, init(params), params)
  assert float(jax.jit(optax.tree.norm)(updates)) == pytest.approx(1.0, rel=1e-5)


def test_expert_params_split_over_expert_axis_and_state_on_mesh():
  config = config_lib.base_config()
  model = nn.build_model(config.model)
  abstract = jax.eval_shape(
      lambda k: model.init({'params': k, 'gating': k, 'dropout': k},
                           jnp.zeros((1, 28, 28, 1)), train=False)['params'],
      jax.random.key(0))
  mesh = parallel.make_mesh({'data': -1, 'expert': 2})
  assert dict(mesh.shape) == {'data': 4, 'expert': 2}
  shardings = parallel.param_shardings(mesh, abstract, [(nn.EXPERT_PARAMS_REGEX,
                                                             P('expert'))])
  experts = shardings['encoder']['encoderblock_1']['moe']['experts']
  assert all(s.spec == P('expert') for s in experts.values())
  assert shardings['encoder']['encoderblock_1']['moe']['router']['kernel'].spec == P()
  tx = opt.make_optimizer(config.optimizer, optax.constant_schedule(1e-3), abstract)
  state_shardings = parallel.opt_state_shardings(tx, jax.eval_shape(tx.init, abstract),
                                                     shardings, mesh)
  mu = next(s for s in state_shardings if hasattr(s, 'mu')).mu  # The Adam state.
  assert mu['encoder']['encoderblock_1']['moe']['experts']['wi_kernel'].spec == P('expert')
  # optax's step count would land on device 0 alone; here it is replicated on the mesh.
  small = {'experts': jnp.ones((4, 3)), 'dense': jnp.ones((3,))}
  small_shardings = parallel.param_shardings(mesh, small, [('experts', P('expert'))])
  small = jax.device_put(small, small_shardings)
  tx = opt.make_optimizer(config.optimizer, optax.constant_schedule(1e-3), small)
  state = jax.jit(tx.init, out_shardings=parallel.opt_state_shardings(
      tx, jax.eval_shape(tx.init, small), small_shardings, mesh))(small)
  count = [x for x in jax.tree.leaves(state) if x.ndim == 0][0]
  assert count.sharding.mesh.shape == mesh.shape and count.sharding.spec == P()
  assert len(count.sharding.device_set) == 8
  with pytest.raises(ValueError, match='divide'):
    parallel.make_mesh({'data': -1, 'expert': 3})
  assert dict(parallel.make_mesh({'data': -1, 'expert': -1}, num_experts=4).shape) == {
      'data': 2, 'expert': 4}


def _cfg(**kw):
  cfg = dict(config_lib.base_config().optimizer)
  cfg.update(kw)
  return cfg


def test_adafactor_first_update_against_the_factored_formula():
  rng = np.random.default_rng(0)
  g = rng.normal(size=(64, 48)).astype(np.float32)   # Factored (both dims >= 32).
  b = rng.normal(size=(48,)).astype(np.float32)       # Too small: full second moment.
  params = {'w': np.zeros((64, 48), np.float32), 'b': np.zeros((48,), np.float32)}
  init, update = _jitted(opt.make_optimizer(_cfg(name='adafactor', momentum=0.9),
                                            optax.constant_schedule(0.5), params))
  updates, state = update({'w': g, 'b': b}, init(params), params)
  # Step 1: decay min(1 - 1^-0.8, b2) = 0, so the moments are this step's.
  eps = 1e-30
  v_row, v_col = (g ** 2 + eps).mean(1), (g ** 2 + eps).mean(0)
  scaled = g / np.sqrt(np.outer(v_row, v_col) / v_row.mean())
  np.testing.assert_allclose(updates['w'], -0.5 * 0.1 * scaled, rtol=1e-5)
  # Unfactored: g / sqrt(g^2) = sign(g); then momentum 0.9 without debiasing.
  np.testing.assert_allclose(updates['b'], -0.5 * 0.1 * np.sign(b), rtol=1e-5)
  factored = next(s for s in jax.tree.leaves(state, is_leaf=lambda s: hasattr(s, 'v_row'))
                  if hasattr(s, 'v_row'))
  assert {factored.v_row['w'].shape, factored.v_col['w'].shape} == {(64,), (48,)}
  assert factored.v['w'].shape == (1,) and factored.v['b'].shape == (48,)


def test_mu_dtype_keeps_the_first_moment_in_bfloat16():
  params = {'w': np.ones((4, 3), np.float32)}
  for name, field in (('adam', 'mu'), ('sgd', 'trace'), ('adafactor', 'ema')):
    init, update = _jitted(opt.make_optimizer(_cfg(name=name, mu_dtype='bfloat16'),
                                              optax.constant_schedule(0.1), params))
    state = init(params)
    moments = [s for s in jax.tree.leaves(state, is_leaf=lambda s: hasattr(s, field))
               if hasattr(s, field)]
    assert moments and getattr(moments[0], field)['w'].dtype == jnp.bfloat16, name
    updates, _ = update({'w': np.full((4, 3), 0.5, np.float32)}, state, params)
    new = jax.jit(optax.apply_updates)(params, updates)
    assert new['w'].dtype == jnp.float32 and np.isfinite(new['w']).all()
    assert float(np.asarray(new['w'])[0, 0]) < 1.0, name


def test_adafactor_state_follows_the_expert_split_on_eight_devices():
  # Expert kernels (E, D, H) keep E in their factored rows and columns, which are
  # split over 'expert' like the kernel; the (1,) placeholders are replicated.
  params = {'experts': {'wi_kernel': jnp.ones((4, 32, 128))}, 'dense': jnp.ones((128,))}
  mesh = parallel.make_mesh({'data': -1, 'expert': 2}, num_experts=4)
  shardings = parallel.param_shardings(mesh, params, [('experts', P('expert'))])
  tx = opt.make_optimizer(_cfg(name='adafactor', mu_dtype='bfloat16'),
                          optax.constant_schedule(1e-2), params)
  opt_shardings = parallel.opt_state_shardings(tx, jax.eval_shape(tx.init, params),
                                                   shardings, mesh)
  params = jax.device_put(params, shardings)
  state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
  factored = next(s for s in jax.tree.leaves(state, is_leaf=lambda s: hasattr(s, 'v_row'))
                  if hasattr(s, 'v_row'))
  for stat in (factored.v_row, factored.v_col):  # (4, 32) and (4, 128) of (4, 32, 128).
    assert stat['experts']['wi_kernel'].sharding.spec == P('expert')
  assert factored.v['experts']['wi_kernel'].sharding.spec == P()  # The (1,) placeholder.
  update = jax.jit(tx.update, out_shardings=(shardings, opt_shardings))
  grads = jax.tree.map(lambda x: 0.1 * x, params)
  for _ in range(3):
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
  assert params['experts']['wi_kernel'].sharding.spec == P('expert')
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_adafactor_with_bfloat16_momentum_trains_a_few_steps():
  from tests.train.helpers import small_config  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import state as state_lib  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import step as step_lib  # pylint: disable=g-import-not-at-top
  config = small_config(model__name='vit', optimizer__name='adafactor',
                        optimizer__mu_dtype='bfloat16')
  model = nn.build_model(config.model)
  # Jitted: eagerly, each op of init (and of the optimizer's init) compiles on its own.
  params = jax.jit(lambda k: model.init({'params': k}, jnp.zeros((1, 28, 28, 1)),
                                        train=False)['params'])(jax.random.key(0))
  tx = opt.make_optimizer(config.optimizer, optax.constant_schedule(3e-3), params)
  state = jax.jit(lambda p: state_lib.create(p, tx, jax.random.key(1)))(params)
  rng = np.random.default_rng(0)
  batch = {'image': rng.uniform(size=(16, 28, 28, 1)).astype(np.float32),
           'label': rng.integers(0, 10, size=16)}
  step = jax.jit(step_lib.make_step(model, tx))
  losses = []
  for _ in range(4):
    state, values = step(state, batch)
    losses.append(float(values['loss']))
  assert np.isfinite(losses).all() and losses[-1] < losses[0]
