"""Eval-time routing overrides of a checkpoint's model config (shared by the CLI and the API).

A checkpoint's metadata holds the model config it was trained with
(`meta['model_config']`). Evaluating it with other routing is a matter of
changing a few keys of `model.encoder.moe.router` before the model is built:

  router                the router's name (e.g. 'sparse_ot' on a TopK-trained model)
  num_selected_experts  K, experts per token (also enters C)
  capacity_factor       C = ceil(S * K * capacity_factor / E), rounded up to a multiple
                        of 4 (the router's own rule: expert_choice counts S, not S * K,
                        tokens); replaces a fixed `capacity` of the checkpoint's config
  capacity              C as is (capped at S)
  batch_priority        token-choice routers: tokens with larger top gates claim slots first

The parameters do not depend on these keys for the sparse routers (their router
layer is a Dense(E)), so any of them can run on any sparse checkpoint; `soft_moe`'s
slot parameters depend on C, and `check_param_shapes` refuses what does not fit.

Errors are `RoutingOverrideError` (a ValueError) whose message starts with
`key=value: ` so the command line can show it as a flag (`--key=value: ...`).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from typing import Any, Mapping

import numpy as np

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.abstract_init import abstract_variables
from vmoe_sparse_ot.trees import leaf_shapes, shape_differences
from vmoe_sparse_ot.values import is_int

ROUTING_OVERRIDES = ('router', 'num_selected_experts', 'capacity_factor', 'capacity',
                     'batch_priority')
ROUTER_KEY = 'model.encoder.moe.router'


class RoutingOverrideError(ValueError):
  """An override that is unknown, of the wrong type or value, or does not fit the checkpoint."""

  def __init__(self, key: str, value: Any, problem: str):
    self.key, self.value, self.problem = key, value, problem
    super().__init__(f'{key}={value!r}: {problem}' if key else problem)


def normalize_routing_overrides(overrides: Mapping[str, Any]) -> dict[str, Any]:
  """Checks names, types and ranges (no checkpoint needed); returns them as plain Python values.

  Raises RoutingOverrideError naming the first bad key.
  """
  out = {}
  for key, value in overrides.items():
    if key not in ROUTING_OVERRIDES:
      raise RoutingOverrideError(key, value, 'unknown routing override; valid: '
                                 + ', '.join(ROUTING_OVERRIDES))
    if key == 'router' and value not in routers.ROUTERS:
      raise RoutingOverrideError(key, value,
                                 f'unknown router; valid: {", ".join(sorted(routers.ROUTERS))}')
    if key == 'num_selected_experts' and not (is_int(value, numpy_ints=True) and value >= 1):
      raise RoutingOverrideError(key, value, 'must be an integer >= 1')
    if key == 'capacity_factor' and not (
        isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
        and math.isfinite(value) and value > 0):
      raise RoutingOverrideError(key, value, 'must be a finite number > 0')
    if key == 'capacity' and value is not None and not (
        is_int(value, numpy_ints=True) and value >= 1):
      raise RoutingOverrideError(key, value, 'must be an integer >= 1 or None')
    if key == 'batch_priority' and not isinstance(value, (bool, np.bool_)):
      raise RoutingOverrideError(key, value, 'must be True or False')
    convert = {'router': str, 'num_selected_experts': int, 'capacity_factor': float,
               'capacity': int, 'batch_priority': bool}[key]
    out[key] = None if value is None else convert(value)
  if out.get('capacity') is not None and 'capacity_factor' in out:
    raise RoutingOverrideError('capacity_factor', out['capacity_factor'],
                               f'give either capacity_factor or capacity (capacity='
                               f'{out["capacity"]} would decide C)')
  return out


def apply_routing_overrides(model_config: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
  """A copy of `model_config` (a dict, as in checkpoint metadata) with the routing overrides.

  Args:
    model_config: a model config (`config.model` as a dict, or a ConfigDict).
    **overrides: any of `ROUTING_OVERRIDES`; a key left out keeps the checkpoint's value.

  Returns:
    The new model config as a plain dict, validated by `nn.build_model`.

  Raises:
    RoutingOverrideError: an unknown key, a bad value, K > E, C > S, a dense model
      (nothing to route), or a capacity override the router ignores (e.g. `sparse_ot`
      with its own `k`, which fixes C).
  """
  overrides = normalize_routing_overrides(overrides)
  config = copy.deepcopy(model_config.to_dict() if hasattr(model_config, 'to_dict')
                         else dict(model_config))
  if not overrides:
    return config
  if config.get('name') != 'vit_moe':
    key = next(iter(overrides))
    raise RoutingOverrideError(key, overrides[key], f"the checkpoint's model is "
                               f"{config.get('name')!r}, which has no MoE layers to route")
  moe = config['encoder']['moe']
  router = moe['router']
  num_experts, group_size = int(moe['num_experts']), int(moe['group_size'])
  for key, value in overrides.items():
    router['name' if key == 'router' else key] = value
  if 'capacity_factor' in overrides:
    router['capacity'] = None  # Else a fixed capacity of the checkpoint would decide C.
  if router.get('num_selected_experts', 1) > num_experts:
    raise RoutingOverrideError('num_selected_experts', router['num_selected_experts'],
                               f'must be <= {num_experts}, the number of experts (K <= E)')
  if router.get('capacity') is not None and router['capacity'] > group_size:
    raise RoutingOverrideError('capacity', router['capacity'],
                               f'must be <= {group_size}, the group size (C <= S)')
  try:
    nn.build_model(config)  # Every router option, checked by the router itself.
  except ValueError as e:
    raise RoutingOverrideError('', None, f'with these routing overrides: {e}') from None
  _check_capacity_applies(config, overrides, group_size, num_experts)
  return config


def _check_capacity_applies(config, overrides, group_size: int, num_experts: int) -> None:
  """Refuses a capacity override that the router's own capacity rule does not read."""
  key = next((k for k in ('capacity_factor', 'capacity') if k in overrides), None)
  if key is None or overrides[key] is None or group_size == 1:
    return
  parsed = routers.parse_router_options(config['encoder']['moe']['router'])
  router = routers.get_router(parsed.name)
  low, high = (dict(capacity_factor=1e-6, capacity=None), dict(capacity_factor=1e6, capacity=None)
               ) if key == 'capacity_factor' else (dict(capacity=1), dict(capacity=group_size))
  sizes = [router.capacity(dataclasses.replace(parsed.options, **kw), group_size, num_experts)
           for kw in (low, high)]
  if sizes[0] == sizes[1]:
    raise RoutingOverrideError(
        key, overrides[key], f'has no effect: router {parsed.name!r} takes its buffer size from '
        f'its own options ({ROUTER_KEY}.{parsed.name}.*), C={sizes[0]}')


def capacity(model_config: Mapping[str, Any]) -> int | None:
  """C, the buffer slots per expert and group of the model's MoE layers (None for 'vit')."""
  if model_config.get('name') != 'vit_moe':
    return None
  moe = model_config['encoder']['moe']
  parsed = routers.parse_router_options(moe['router'])
  return int(routers.get_router(parsed.name).capacity(
      parsed.options, int(moe['group_size']), int(moe['num_experts'])))


def describe(overrides: Mapping[str, Any]) -> str:
  """'router sparse_ot, capacity_factor 0.5, batch_priority' ('' when there are none)."""
  parts = []
  for key in ROUTING_OVERRIDES:
    if key not in overrides:
      continue
    value = overrides[key]
    if key == 'batch_priority':
      parts.append('batch_priority' if value else 'no batch_priority')
    else:
      parts.append(f'{key} {value:g}' if isinstance(value, float) else f'{key} {value}')
  return ', '.join(parts)


def name_suffix(overrides: Mapping[str, Any]) -> str:
  """Short file-name tags of the overrides: '-sparse_ot-k1-cf0.5-c8-bpr' (or '-nobpr')."""
  tags = {'router': lambda v: str(v), 'num_selected_experts': lambda v: f'k{v}',
          'capacity_factor': lambda v: f'cf{v:g}', 'capacity': lambda v: f'c{v}',
          'batch_priority': lambda v: 'bpr' if v else 'nobpr'}
  return ''.join(f'-{tags[k](overrides[k])}' for k in ROUTING_OVERRIDES if k in overrides)


def image_shape(param_shapes: Mapping[str, list[int]], classifier: str,
                image_size: int | None = None) -> tuple[int, int, int]:
  """(H, W, C) the model was built for, from its parameter shapes (square images).

  `param_shapes` as in checkpoint metadata: {'embedding/kernel': [ph, pw, C, D],
  'encoder/pos_embedding': [1, N, D], ...}; N counts the class token for 'token'.
  A model without the position-embedding parameter (model.encoder.position_emb
  'sincos2d' or 'none') does not tell its size: then H = W = `image_size` (a
  config's dataset.image_size), and without it a ValueError says so.
  """
  ph, pw, channels, _ = param_shapes['embedding/kernel']
  if 'encoder/pos_embedding' not in param_shapes and 'embedding/kernel' in param_shapes:
    if image_size is not None:
      return int(image_size), int(image_size), channels
    raise ValueError("no encoder/pos_embedding among the parameters: the image size is "
                     "read from it (a model with model.encoder.position_emb 'sincos2d' or "
                     "'none' does not tell its image size)")
  num_tokens = param_shapes['encoder/pos_embedding'][1]
  patches = num_tokens - (1 if classifier == 'token' else 0)
  side = math.isqrt(patches)
  if side * side != patches:
    raise ValueError(f'the model has {patches} patches, not a square grid: cannot tell its '
                     'image size')
  return side * ph, side * pw, channels


def num_tokens(param_shapes: Mapping[str, list[int]], image_shape: tuple[int, int, int],
               classifier: str) -> int:
  """N, the encoder's tokens of one image of `image_shape`: its patches (the patch size
  read from 'embedding/kernel') and, for classifier 'token', the class token."""
  ph, pw = param_shapes['embedding/kernel'][:2]
  return (image_shape[0] // ph) * (image_shape[1] // pw) + int(classifier == 'token')


def check_param_shapes(model, param_shapes: Mapping[str, list[int]],
                       overrides: Mapping[str, Any], input_shape: tuple[int, int, int]) -> None:
  """Raises RoutingOverrideError when the checkpoint's parameters do not fit `model`.

  `param_shapes` {'a/b/kernel': shape} from checkpoint metadata (or the restored
  arrays); only shapes are traced, no array is made.
  """
  expected = leaf_shapes(abstract_variables(model, input_shape)['params'])
  diffs = shape_differences(param_shapes, expected, labels=('checkpoint', 'model'))
  if diffs:
    key = next((k for k in ROUTING_OVERRIDES if k in overrides), '')
    raise RoutingOverrideError(
        key, overrides.get(key), "the checkpoint's parameters do not fit the model with these "
        f'routing overrides ({"; ".join(diffs[:4])}{"; ..." if len(diffs) > 4 else ""})')
