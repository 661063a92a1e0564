"""train.state: the step-0 TrainState, its shardings and the finiteness check, on
hand-made trees."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import state as state_lib

PARAMS = {'moe': {'experts': {'wi': np.ones((2, 3), np.float32)}},
          'head': {'kernel': np.full((3,), 2.0, np.float32)}}


def test_create_starts_at_step_zero_with_a_fresh_optimizer_and_the_key_as_data():
  root = jax.random.key(7)
  state = state_lib.create(PARAMS, optax.sgd(0.1, momentum=0.9), root)
  assert state.step.dtype == jnp.int32 and state.step.shape == () and int(state.step) == 0
  assert state.rng.dtype == jnp.uint32 and state.rng.shape == (2,)
  np.testing.assert_array_equal(state.rng, jax.random.key_data(root))
  np.testing.assert_array_equal(jax.random.key_data(state.key), jax.random.key_data(root))
  trace = state.opt_state[0].trace                # momentum starts at zero
  np.testing.assert_array_equal(trace['moe']['experts']['wi'], np.zeros((2, 3)))
  assert state.params is PARAMS and state.model_state == {}
  bias = {'router_state': {'encoderblock_1': {'bias': np.zeros(4, np.float32)}}}
  assert state_lib.create(PARAMS, optax.sgd(0.1), root, bias).model_state is bias


def test_expert_parameters_and_their_statistics_split_over_expert_the_rest_replicated():
  mesh = parallel.make_mesh({'data': -1, 'expert': 2}, jax.devices()[:2], 2)
  tx = optax.sgd(0.1, momentum=0.9)
  bias = {'router_state': {'encoderblock_1': {'bias': np.zeros(4, np.float32)}}}
  abstract = jax.eval_shape(lambda: state_lib.create(PARAMS, tx, jax.random.key(0), bias))
  shardings = state_lib.shardings_on_mesh(mesh, tx, abstract)
  split, replicated = NamedSharding(mesh, P('expert')), NamedSharding(mesh, P())
  assert shardings.params == {'moe': {'experts': {'wi': split}}, 'head': {'kernel': replicated}}
  assert shardings.opt_state[0].trace == shardings.params
  assert shardings.rng == shardings.step == replicated
  assert shardings.model_state == {'router_state': {'encoderblock_1': {'bias': replicated}}}
  # The form Orbax restores into: each leaf's shape and dtype with its sharding.
  restore = state_lib.with_shardings(abstract, shardings)
  wi = restore.params['moe']['experts']['wi']
  assert (wi.shape, wi.dtype, wi.sharding) == ((2, 3), jnp.float32, split)
  assert (restore.step.shape, restore.step.dtype, restore.step.sharding) == ((), jnp.int32,
                                                                             replicated)


def test_all_finite_reads_floating_leaves_only():
  ints = {'count': np.array([2**31 - 1], np.int32)}
  assert bool(state_lib.all_finite({**PARAMS, **ints}))
  assert bool(state_lib.all_finite(ints)) and bool(state_lib.all_finite({}))
  for bad in (np.nan, np.inf, -np.inf):
    tree = {**PARAMS, 'head': {'kernel': np.array([1.0, bad, 2.0], np.float32)}}
    assert not bool(state_lib.all_finite(tree)), bad
  assert not bool(state_lib.all_finite({'half': jnp.array([jnp.inf], jnp.bfloat16)}))
