"""nn.abstract_init: a model's variables traced for their shapes, no array made."""
import jax
import numpy as np

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn.abstract_init import abstract_variables
from tests.nn.helpers import tiny_config


def _shape(variables, *path):
  node = variables
  for key in path:
    node = node[key]
  assert isinstance(node, jax.ShapeDtypeStruct)  # Traced, not computed.
  return tuple(node.shape)


def test_shapes_follow_the_config_and_the_image_size():
  # tiny_config: D=16, patches 4x4, MLP 32, E=4 experts in block 1, 3 classes.
  variables = abstract_variables(nn.build_model(tiny_config()), (8, 8, 3))
  assert list(variables) == ['params']           # TopK keeps no router state.
  params = variables['params']
  assert _shape(params, 'embedding', 'kernel') == (4, 4, 3, 16)
  assert _shape(params, 'encoder', 'pos_embedding') == (1, 4, 16)   # (8/4)^2 tokens
  assert _shape(params, 'encoder', 'encoderblock_1', 'moe', 'experts', 'wi_kernel') == (4, 16, 32)
  assert _shape(params, 'encoder', 'encoderblock_1', 'moe', 'router', 'kernel') == (16, 4)
  assert _shape(params, 'head', 'kernel') == (16, 3)
  assert params['embedding']['kernel'].dtype == np.float32
  # 16x16 images: 16 tokens; nothing else changes.
  bigger = abstract_variables(nn.build_model(tiny_config()), (16, 16, 3))['params']
  assert _shape(bigger, 'encoder', 'pos_embedding') == (1, 16, 16)
  assert _shape(bigger, 'embedding', 'kernel') == (4, 4, 3, 16)


def test_a_stateful_router_adds_its_state_collection():
  variables = abstract_variables(nn.build_model(tiny_config('topk_bias')), (8, 8, 1))
  assert sorted(variables) == ['params', nn.router_state.STATE]
  # One bias per expert, in the MoE layer only.
  assert _shape(variables[nn.router_state.STATE], 'encoder', 'encoderblock_1', 'moe',
                'bias') == (4,)
  assert _shape(variables['params'], 'embedding', 'kernel') == (4, 4, 1, 16)
