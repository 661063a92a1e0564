"""The model config: its defaults, derived from the option fields, and its records.

Configs in `configs/` start from `default_model_config()` and override what they
need, so a locked ConfigDict rejects typos while every router option stays
reachable from the command line (`--config.model.encoder.moe.router.name=sbase`).
The options themselves (default, doc, check) are defined once, in
`nn.model_options` (the model's) and `nn.routers` (the routers'). This module
also says how a model config is recorded with a checkpoint so that workdirs
written before later keys existed still resume (`without_compute_keys`).
"""
import copy
import dataclasses
import typing

import ml_collections

from vmoe_sparse_ot.nn import model_options
from vmoe_sparse_ot.nn import routers
# Public here too (importers of nn.model_config): defined in their own modules.
from vmoe_sparse_ot.nn.model_options import MODEL_DTYPES, MODELS  # noqa: F401
from vmoe_sparse_ot.nn.model_options import check_model_options  # noqa: F401
from vmoe_sparse_ot.nn.variants import VIT_SIZES, VMOE_PREFIX, VMOE_SIZES  # noqa: F401
from vmoe_sparse_ot.nn.variants import variant_sizes  # noqa: F401


def _config_value(value, annotation):
  """A ConfigDict leaf: None defaults keep their type for command-line overrides."""
  if value is None:
    inner = next(a for a in typing.get_args(annotation) if a is not type(None))
    return ml_collections.FieldReference(None, field_type=inner)
  return value


def default_router_config() -> ml_collections.ConfigDict:
  """Every router option with its default, derived from the routers' options dataclasses.

  `name` picks the router (`nn.routers.ROUTERS`); options shared by routers sit
  at the top level, each router's own options in a sub-dict named after it. The
  options' meanings are documented on the dataclasses in `nn/routers/`.
  """
  types = {}
  for r in routers.ROUTERS.values():
    hints = typing.get_type_hints(r.options)
    top = routers.base.top_level_fields(r.options)
    for f in dataclasses.fields(r.options):
      types[(None if f.name in top else r.name, f.name)] = hints[f.name]
  out = {}
  for key, value in routers.default_config().items():
    if isinstance(value, dict):
      out[key] = {k: _config_value(v, types[(key, k)]) for k, v in value.items()}
    else:
      out[key] = _config_value(value, types.get((None, key), str))
  return ml_collections.ConfigDict(out)


# model keys that change how the model computes (precision, memory), not its
# parameters or its function: a checkpoint resumes and is evaluated under any
# values of them, and checkpoints written before they existed lack them.
COMPUTE_KEYS = ('dtype', 'remat')
# What a record without them means: their values before they existed (history,
# like LATER_DEFAULTS below, so not read from today's option defaults).
COMPUTE_DEFAULTS = {'dtype': None, 'remat': False}


# Keys added after checkpoints recorded model configs, with their defaults: a
# record leaves them out at these values, and a record without them means these
# values, so workdirs written before they existed still resume and evaluate.
# (What those records mean, so written here, not read from today's defaults.)
LATER_DEFAULTS = {
    ('encoder', 'moe', 'dropout_rate'): None,
    ('encoder', 'moe', 'router', 'capacity_ceil_or_round'): 'ceil',
    ('encoder', 'moe', 'router', 'capacity_multiple_of'): 4,
    ('encoder', 'attention_qk_norm'): False,
    ('encoder', 'position_emb'): 'learned',
    ('head_kernel_zero_init',): True,
    ('encoder', 'moe', 'router', 'soft_moe', 'num_slots'): None,
    ('encoder', 'moe', 'router', 'soft_moe', 'compute_similarity_metrics'): False,
    ('ensemble_size',): 1,
    ('encoder', 'moe', 'router', 'sparse_ot', 'tol'): 1e-6,
}


# Router keys that choose how the router computes, not the model's parameters or
# its function: sparse_ot's implementation (the same plans up to rounding, see
# nn/routers/sparse_ot.py). Like COMPUTE_KEYS they are not compared when a
# checkpoint resumes or is evaluated: records from before 'auto' became the
# default hold 'fast', and resume under 'auto' (set 'fast' to continue
# bit-identically). Records keep them, so an evaluation with the checkpoint's
# config runs the path it trained with.
ROUTER_COMPUTE_KEYS = (('encoder', 'moe', 'router', 'sparse_ot', 'implementation'),)


def _without_router_compute_keys(model_config: dict) -> dict:
  for path in ROUTER_COMPUTE_KEYS:
    node = model_config
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(path[-1], None)
  return model_config


def _without_later_defaults(model_config: dict) -> dict:
  out = copy.deepcopy(model_config)
  for path, default in LATER_DEFAULTS.items():
    node = out
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and path[-1] in node and node[path[-1]] == default:
      del node[path[-1]]
  return out


def _with_resolved_solver_steps(model_config: dict) -> dict:
  """sparse_ot's num_steps=None as the count it means for its solver (10 for
  'newton', 50 for 'adam' and 'lbfgs'), so that a record from before None meant
  "the solver's default" (it held 50 with 'adam') compares equal to it."""
  node = model_config
  for key in ('encoder', 'moe', 'router', 'sparse_ot'):
    node = node.get(key) if isinstance(node, dict) else None
  if isinstance(node, dict) and node.get('num_steps', 0) is None:
    solver = node.get('solver', routers.sparse_ot.SparseOTOptions.solver)
    node['num_steps'] = routers.sparse_ot.num_steps(
        routers.sparse_ot.SparseOTOptions(solver=solver))
  return model_config


def without_compute_keys(model_config, *, only_defaults: bool = False) -> dict:
  """A copy of a model config dict without `COMPUTE_KEYS` (with `only_defaults`,
  only those at their defaults, so a record looks as it did before they existed),
  without the `LATER_DEFAULTS` keys at their defaults, and (without
  `only_defaults`: for comparisons) without `ROUTER_COMPUTE_KEYS`."""
  out = _without_later_defaults(
      {k: v for k, v in dict(model_config).items()
       if k not in COMPUTE_KEYS or (only_defaults and v != COMPUTE_DEFAULTS[k])})
  return out if only_defaults else _without_router_compute_keys(
      _with_resolved_solver_steps(out))


def num_prefix_tokens(model_config) -> int:
  """Tokens before the patches in the encoder: 1 (the class token) for classifier 'token'."""
  return int(model_config.get('classifier', model_options.ModelOptions.classifier) == 'token')


def _section_config(options: type) -> dict:
  """A section's config dict: every option at its default, in field order."""
  hints = typing.get_type_hints(options)
  out = {}
  for f in dataclasses.fields(options):
    sub = f.metadata.get('section')
    if sub is routers.RouterConfig:
      out[f.name] = default_router_config()
    elif sub is not None:
      out[f.name] = _section_config(sub)
    else:
      out[f.name] = _config_value(f.default, hints[f.name])
  return out


def default_model_config() -> ml_collections.ConfigDict:
  """A small V-MoE (the defaults of `nn.model_options`); the paper's B/32 and B/16
  override sizes in `configs/`."""
  return ml_collections.ConfigDict(_section_config(model_options.ModelOptions))
