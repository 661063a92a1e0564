"""The model config: its defaults, derived from the option fields, and its records.

Configs in `configs/` start from `default_model_config()` and override what they
need, so a locked ConfigDict rejects typos while every router option stays
reachable from the command line (`--config.model.encoder.moe.router.name=sbase`).
The options themselves (default, doc, check) are defined once, in
`nn.model_options` (the model's) and `nn.routers` (the routers'). This module
also says how a model config is recorded with a checkpoint so that workdirs
written before later keys existed still resume (`without_compute_keys`).
"""
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
