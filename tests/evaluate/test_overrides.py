"""evaluate.overrides: routing overrides of a checkpoint's model config, and what they keep."""
import numpy as np
import pytest

from tests.nn.helpers import tiny_config
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.evaluate import overrides as overrides_lib


def _model_config(router='topk', **router_keys):
  config = nn.model_config.default_model_config()
  config.encoder.moe.router.name = router
  config.encoder.moe.router.update(router_keys)
  return config


def test_apply_routing_overrides_sets_the_keys_and_checks_them():
  base = _model_config(capacity=8)
  out = overrides_lib.apply_routing_overrides(
      base, router='sparse_ot', num_selected_experts=1, capacity_factor=0.5,
      batch_priority=np.bool_(True))
  router = out['encoder']['moe']['router']
  assert (router['name'], router['num_selected_experts'], router['capacity_factor'],
          router['capacity'], router['batch_priority']) == ('sparse_ot', 1, 0.5, None, True)
  assert base.encoder.moe.router.capacity == 8  # A copy; the input is left alone.
  assert overrides_lib.apply_routing_overrides(base) == base.to_dict()
  assert overrides_lib.capacity(out) == 4  # ceil(64 * 1 * 0.5 / 8) = 4
  for kwargs, message in [
      ({'num_selected_experts': 9}, 'num_selected_experts=9: must be <= 8, the number of experts'),
      ({'capacity': 65}, 'capacity=65: must be <= 64, the group size'),
      ({'capacity': 4, 'capacity_factor': 1.0}, 'give either capacity_factor or capacity'),
      ({'batch_priority': 'yes'}, "batch_priority='yes': must be True or False"),
      ({'num_selected_experts': 1.5}, 'num_selected_experts=1.5: must be an integer >= 1')]:
    with pytest.raises(overrides_lib.RoutingOverrideError, match=message):
      overrides_lib.apply_routing_overrides(base, **kwargs)
  # sparse_ot with its own k: k is C, so a capacity factor would silently do nothing.
  with pytest.raises(overrides_lib.RoutingOverrideError,
                     match=r"capacity_factor=0.5: has no effect: router 'sparse_ot' takes its "
                     r'buffer size from its own options .*sparse_ot.\*\), C=16'):
    config = _model_config('sparse_ot')
    config.encoder.moe.router.sparse_ot.k = 16
    overrides_lib.apply_routing_overrides(config, capacity_factor=0.5)
  dense = _model_config()
  dense.name = 'vit'
  with pytest.raises(overrides_lib.RoutingOverrideError, match="'vit', which has no MoE layers"):
    overrides_lib.apply_routing_overrides(dense, capacity_factor=0.5)


def test_normalize_checks_types_and_returns_plain_python_values():
  out = overrides_lib.normalize_routing_overrides(
      {'num_selected_experts': np.int64(2), 'capacity_factor': np.float32(0.5),
       'batch_priority': np.bool_(False), 'router': 'topk'})
  assert out == {'num_selected_experts': 2, 'capacity_factor': 0.5, 'batch_priority': False,
                 'router': 'topk'}
  assert [type(out[k]) for k in ('num_selected_experts', 'capacity_factor', 'batch_priority')
          ] == [int, float, bool]
  assert overrides_lib.normalize_routing_overrides({'capacity': None}) == {'capacity': None}
  for bad, message in [({'capacity': True}, 'capacity=True: must be an integer >= 1 or None'),
                       ({'num_selected_experts': 0}, 'num_selected_experts=0: must be an '
                        'integer >= 1'),
                       ({'capacity_factor': float('inf')}, 'capacity_factor=inf: must be a '
                        'finite number > 0')]:
    with pytest.raises(overrides_lib.RoutingOverrideError) as e:
      overrides_lib.normalize_routing_overrides(bad)
    assert str(e.value) == message


def test_describe_and_name_suffix_follow_the_overrides_order():
  overrides = {'batch_priority': False, 'capacity_factor': 0.5, 'router': 'sparse_ot',
               'num_selected_experts': 1}
  assert overrides_lib.describe(overrides) == (
      'router sparse_ot, num_selected_experts 1, capacity_factor 0.5, no batch_priority')
  assert overrides_lib.name_suffix(overrides) == '-sparse_ot-k1-cf0.5-nobpr'
  assert overrides_lib.name_suffix({'capacity': 8, 'batch_priority': True}) == '-c8-bpr'
  assert overrides_lib.describe({}) == '' and overrides_lib.name_suffix({}) == ''


def test_image_shape_is_read_from_the_patch_and_position_embeddings():
  shapes = {'embedding/kernel': [4, 4, 3, 16], 'encoder/pos_embedding': [1, 17, 16]}
  assert overrides_lib.image_shape(shapes, 'token') == (16, 16, 3)   # 16 patches + class
  shapes['encoder/pos_embedding'] = [1, 16, 16]
  assert overrides_lib.image_shape(shapes, 'gap') == (16, 16, 3)
  with pytest.raises(ValueError, match='the model has 15 patches, not a square grid'):
    overrides_lib.image_shape(shapes, 'token')
  with pytest.raises(ValueError, match='no encoder/pos_embedding among the parameters'):
    overrides_lib.image_shape({'embedding/kernel': [4, 4, 3, 16]}, 'gap')


def _tiny_param_shapes():
  """tiny_config's parameters by hand: D=16, 2 heads of 8, MLP 32, block 1 with E=4
  experts, 4x4 patches of 8x8x3 images (4 tokens), 3 classes."""
  shapes = {'embedding/kernel': [4, 4, 3, 16], 'embedding/bias': [16],
            'encoder/pos_embedding': [1, 4, 16], 'encoder/encoder_norm/bias': [16],
            'encoder/encoder_norm/scale': [16], 'head/kernel': [16, 3], 'head/bias': [3]}
  for i in (0, 1):
    block = f'encoder/encoderblock_{i}'
    for name in ('key', 'query', 'value'):
      shapes.update({f'{block}/attention/{name}/kernel': [16, 2, 8],
                     f'{block}/attention/{name}/bias': [2, 8]})
    shapes.update({f'{block}/attention/out/kernel': [2, 8, 16],
                   f'{block}/attention/out/bias': [16]})
    for norm in ('norm_att', 'norm_mlp'):
      shapes.update({f'{block}/{norm}/bias': [16], f'{block}/{norm}/scale': [16]})
  shapes.update({'encoder/encoderblock_0/mlp/Dense_0/kernel': [16, 32],
                 'encoder/encoderblock_0/mlp/Dense_0/bias': [32],
                 'encoder/encoderblock_0/mlp/Dense_1/kernel': [32, 16],
                 'encoder/encoderblock_0/mlp/Dense_1/bias': [16],
                 'encoder/encoderblock_1/moe/experts/wi_kernel': [4, 16, 32],
                 'encoder/encoderblock_1/moe/experts/wi_bias': [4, 32],
                 'encoder/encoderblock_1/moe/experts/wo_kernel': [4, 32, 16],
                 'encoder/encoderblock_1/moe/experts/wo_bias': [4, 16],
                 'encoder/encoderblock_1/moe/router/kernel': [16, 4]})
  return shapes


def test_check_param_shapes_names_the_override_and_every_shape_that_differs():
  model = nn.build_model(tiny_config())
  shapes = _tiny_param_shapes()
  overrides_lib.check_param_shapes(model, shapes, {}, (8, 8, 3))   # Its own: no exception.
  shapes['encoder/encoderblock_1/moe/experts/wi_bias'] = [8, 32]
  shapes['extra'] = [1]
  del shapes['head/bias']
  with pytest.raises(overrides_lib.RoutingOverrideError) as e:
    overrides_lib.check_param_shapes(model, shapes, {'capacity_factor': 2.0}, (8, 8, 3))
  assert str(e.value) == (
      "capacity_factor=2.0: the checkpoint's parameters do not fit the model with these "
      'routing overrides (encoder/encoderblock_1/moe/experts/wi_bias: checkpoint [8, 32], '
      'model [4, 32]; extra: checkpoint [1], model <absent>; head/bias: checkpoint <absent>, '
      'model [3])')
