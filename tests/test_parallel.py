"""parallel: the ('data', 'expert') mesh, parameter specs and batches on 8 fake devices."""
import types

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vmoe_sparse_ot import parallel


def test_make_mesh_fills_data_and_picks_expert_shards():
  assert dict(parallel.make_mesh({'data': -1, 'expert': 2}).shape) == {'data': 4, 'expert': 2}
  assert dict(parallel.make_mesh({'data': 8, 'expert': 1}).shape) == {'data': 8, 'expert': 1}
  # expert=-1: gcd(8 devices, E).
  assert dict(parallel.make_mesh({'data': -1, 'expert': -1}, num_experts=6).shape) == {
      'data': 4, 'expert': 2}
  mesh = parallel.make_mesh({'data': -1, 'expert': 1}, devices=jax.devices()[:2])
  assert dict(mesh.shape) == {'data': 2, 'expert': 1}


@pytest.mark.parametrize('mesh_config, message', [
    ({'data': -1, 'expert': 3}, 'config.mesh.expert=3 must be positive and divide the 8 devices'),
    ({'data': -1, 'expert': 0}, 'config.mesh.expert=0 must be positive and divide the 8 devices'),
    ({'data': 2, 'expert': 2}, 'config.mesh data x expert = 2 x 2 must equal the number of '
     'devices 8 (use data=-1 for "the rest")'),
])
def test_make_mesh_refuses_what_does_not_tile_the_devices(mesh_config, message):
  with pytest.raises(ValueError) as e:
    parallel.make_mesh(mesh_config)
  assert str(e.value) == message


PARAMS = {'moe': {'experts': {'wi': np.zeros((4, 6)), 'wo': np.zeros((4, 6, 2))},
                  'router': np.zeros((6, 4))},
          'head': np.zeros((6, 3))}


def test_param_specs_take_the_first_matching_rule_else_replicate():
  specs = parallel.param_specs(PARAMS, [('moe/experts/wo', P(None, 'expert')),
                                        ('experts', P('expert')), ('wo', P('data'))])
  assert specs == {'moe': {'experts': {'wi': P('expert'), 'wo': P(None, 'expert')},
                           'router': P()}, 'head': P()}


def test_check_divisible_names_the_parameter_the_mesh_cannot_split():
  mesh = parallel.make_mesh({'data': -1, 'expert': 2})
  shardings = parallel.param_shardings(mesh, PARAMS, [('experts', P('expert'))])
  assert shardings['moe']['experts']['wi'].spec == P('expert')
  assert shardings['head'].spec == P()
  specs = parallel.param_specs(PARAMS, [('router', P('data'))])   # 6 rows over 4 'data'.
  with pytest.raises(ValueError) as e:
    parallel.check_divisible(PARAMS, specs, mesh)
  assert str(e.value) == ("parameter moe/router of shape (6, 4) cannot be split 4 ways over "
                          "mesh axis 'data': choose config.mesh.expert dividing the number of "
                          'experts')


def test_prefetch_keeps_size_batches_in_flight_and_yields_them_in_order(monkeypatch):
  events = []

  def to_global(batch, sharding):   # data.to_global (TensorFlow's module), recorded.
    events.append(('put', batch['i']))
    return {'i': batch['i'], 'sharding': sharding}

  # The data package loads TensorFlow on first use of to_global: replaced whole.
  monkeypatch.setattr(parallel, 'data_lib', types.SimpleNamespace(to_global=to_global))
  for batch in parallel.prefetch_to_mesh(iter([{'i': i} for i in range(4)]), 'S', size=2):
    assert batch['sharding'] == 'S'
    events.append(('step', batch['i']))
  assert events == [('put', 0), ('put', 1), ('step', 0), ('put', 2), ('step', 1), ('put', 3),
                    ('step', 2), ('step', 3)]


def test_batches_split_over_every_device_and_the_rest_replicates():
  mesh = parallel.make_mesh({'data': -1, 'expert': 2})
  x = jax.make_array_from_process_local_data(parallel.batch_sharding(mesh),
                                             np.arange(16, dtype=np.float32).reshape(8, 2))
  assert x.sharding.spec == P(('data', 'expert'))
  assert sorted(np.asarray(s.data).tolist() for s in x.addressable_shards) == [
      [[2 * i, 2 * i + 1]] for i in range(8)]          # One row on each of the 8 devices.
  assert parallel.replicated(mesh).spec == P()
