"""Model configs with some keys replaced, and whether they keep the parameters.

Shared by the periodic evaluation during training (`config.evaluate.model_overrides`,
a nested dict over `config.model`) and the evaluation job's routing flags
(`evaluate.overrides`): both build another model over the same parameters, so
an override may change how tokens are routed (capacity factor, router, K) but
never a parameter's shape.
"""
from __future__ import annotations

import copy
from typing import Any, Mapping

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn.abstract_init import abstract_variables
from vmoe_sparse_ot.trees import leaf_shapes, shape_differences


def _as_dict(config: Any) -> dict:
  return config.to_dict() if hasattr(config, 'to_dict') else dict(config)


def apply_overrides(model_config: Any, overrides: Mapping[str, Any], where: str) -> dict:
  """A copy of `model_config` (a dict or ConfigDict) with the nested `overrides` in it.

  Each leaf of `overrides` replaces the key at the same path; a dict in
  `overrides` descends into the model config's dict there. Raises ValueError
  naming `where.PATH` for a key the model config does not have, or a dict where
  the model config has a value.
  """
  out = copy.deepcopy(_as_dict(model_config))
  overrides = _as_dict(overrides) if hasattr(overrides, 'to_dict') else overrides

  def merge(node: dict, update: Mapping[str, Any], path: str) -> None:
    if not isinstance(update, Mapping):
      raise ValueError(f'{path} must be a dict of model keys, got {update!r}')
    for key, value in update.items():
      here = f'{path}.{key}'
      if key not in node:
        raise ValueError(f'{here}: the model config has no such key; valid here: '
                         f'{", ".join(sorted(node))}')
      if isinstance(value, Mapping):
        if not isinstance(node[key], dict):
          raise ValueError(f'{here} is a value in the model config, got a dict {dict(value)!r}')
        merge(node[key], value, here)
      else:
        node[key] = _plain(value)

  merge(out, overrides, where)
  return out


def _plain(value: Any) -> Any:
  if hasattr(value, 'to_dict'):
    return value.to_dict()
  return list(value) if isinstance(value, tuple) else value


def leaves(overrides: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'encoder.moe.router.capacity_factor': 4.0, ...}: the dotted paths of the leaves."""
  out = {}
  for key, value in overrides.items():
    path = f'{prefix}{key}'
    out.update(leaves(value, path + '.') if isinstance(value, Mapping) else {path: value})
  return out


def variable_shapes(model, input_shape: tuple[int, ...]) -> dict[str, list[int]]:
  """{'params/a/b/kernel': shape, 'router_state/...': shape} of `model.init` on one
  image of `input_shape` (H, W, C); only shapes are traced, no array is made."""
  return leaf_shapes(abstract_variables(model, input_shape))


def same_variables_model_config(model_config: Any, overrides: Mapping[str, Any],
                                input_shape: tuple[int, ...], where: str) -> dict:
  """`model_config` with `overrides` applied, checked to build a model with the same
  variables (parameters and router state, each of the same shape) on images of
  `input_shape`. Raises ValueError in one line naming `where.KEY`: a key the model
  config lacks, a value the model refuses, or the override that changes a shape."""
  overrides = _as_dict(overrides) if hasattr(overrides, 'to_dict') else overrides
  new = apply_overrides(model_config, overrides, where)
  try:
    model = nn.build_model(new)
  except ValueError as e:
    raise ValueError(f'{where}: {e}') from None
  base = variable_shapes(nn.build_model(_as_dict(model_config)), input_shape)
  diffs = shape_differences(base, variable_shapes(model, input_shape))
  if not diffs:
    return new
  flat = leaves(overrides)
  culprits = [k for k in flat if len(flat) == 1 or shape_differences(base, variable_shapes(
      nn.build_model(apply_overrides(model_config, _nested(k, flat[k]), where)), input_shape))]
  named = ', '.join(f'{where}.{k}={flat[k]!r}' for k in (culprits or flat))
  raise ValueError(f'{named} changes the model\'s parameters ({"; ".join(diffs[:3])}'
                   f'{"; ..." if len(diffs) > 3 else ""}): an evaluation override may change '
                   'how the model routes (capacity, router, experts per token), not its '
                   'parameters')


def _nested(dotted: str, value: Any) -> dict:
  *path, leaf = dotted.split('.')
  out = node = {}
  for key in path:
    node[key] = {}
    node = node[key]
  node[leaf] = value
  return out
