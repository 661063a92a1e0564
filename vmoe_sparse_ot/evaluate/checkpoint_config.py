"""The model config a checkpoint was trained with, read from its metadata (read-only).

Every checkpoint step holds a JSON item 'meta' with the step, the data position
and `model_config` (the run's `config.model` as a dict). Jobs that restore a
checkpoint (few-shot, plots) build the model from it, or compare it with the
config they were given.
"""
from __future__ import annotations

import json
import os
from typing import Any

import ml_collections

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot.errors import CheckpointRestoreError
from vmoe_sparse_ot.nn.model_config import without_compute_keys
from vmoe_sparse_ot.trees import differences, flatten


class CheckpointMismatchError(ValueError):
  """The checkpoint does not fit the model of the config (config keys or parameters)."""


def read_checkpoint_meta(workdir: str, step: int | None = None) -> tuple[dict[str, Any], int]:
  """(metadata, step) of checkpoint `step` of `workdir` (default: the newest whose
  metadata reads), no arrays read: what a job checks before it restores any.

  Raises ValueError naming the flag: --workdir=W when W is not a directory or holds
  no checkpoint, --step=N when it holds no step N (the message lists the steps).
  """
  if not workdir or not os.path.isdir(workdir):
    raise ValueError(f'--workdir={workdir!r}: not a directory')
  try:
    return checkpoints.read_meta(workdir, step)
  except CheckpointRestoreError as e:
    flag = f'--step={step}' if step is not None else f'--workdir={workdir}'
    raise ValueError(f'{flag}: {e}') from None


def model_config_differences(saved: dict[str, Any], model_config: Any) -> list[str]:
  """'model.a.b: config X, checkpoint Y' for every key where the two model configs differ.

  `nn.model_config.COMPUTE_KEYS` (model.dtype, model.remat) are not compared: they
  change how the model computes, not its parameters.
  """
  # JSON round trip: tuples become lists, as they come back from the checkpoint.
  now = json.loads(json.dumps(model_config.to_dict() if hasattr(model_config, 'to_dict')
                              else dict(model_config)))
  return differences(flatten(without_compute_keys(now), 'model.'),
                     flatten(without_compute_keys(saved), 'model.'),
                     labels=('config', 'checkpoint'), show=repr)


def resolve_model_config(config: ml_collections.ConfigDict, meta: dict[str, Any], *,
                         use_checkpoint_config: bool, where: str) -> ml_collections.ConfigDict:
  """`config`, or a copy whose `model` is the checkpoint's `meta['model_config']`.

  Raises CheckpointMismatchError (one line naming every differing key with both
  values) when `config.model` disagrees and `use_checkpoint_config` is False.
  `where` names the checkpoint in the message.
  """
  saved = meta.get('model_config')
  if saved is None:  # Old checkpoints: only the parameter shapes can be compared.
    return config
  diffs = model_config_differences(saved, config.model)
  if not diffs:
    return config
  if not use_checkpoint_config:
    raise CheckpointMismatchError(
        f'config.model differs from the model config of {where}: ' + '; '.join(diffs[:20])
        + (f'; ... and {len(diffs) - 20} more' if len(diffs) > 20 else '')
        + ". Pass --use_checkpoint_config to evaluate with the checkpoint's model config.")
  resolved = ml_collections.ConfigDict(config.to_dict())
  resolved.model = ml_collections.ConfigDict(saved)
  return resolved


def describe_model(model_config: Any) -> dict[str, Any]:
  """{'name', 'router'} of a model config (router None for the dense 'vit')."""
  router = None
  if model_config['name'] == 'vit_moe':
    router = model_config['encoder']['moe']['router']['name']
  return {'name': model_config['name'], 'router': router}
