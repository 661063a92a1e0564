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


def describe_model(model_config: Any) -> dict[str, Any]:
  """{'name', 'router'} of a model config (router None for the dense 'vit')."""
  router = None
  if model_config['name'] == 'vit_moe':
    router = model_config['encoder']['moe']['router']['name']
  return {'name': model_config['name'], 'router': router}
