"""Orbax checkpoints under `WORKDIR/checkpoints`: params, train state and metadata.

Each step directory holds three items:
- 'params': the model parameters (sharded arrays, written by every process);
- 'state': optimizer state and the RNG key data;
- 'meta': JSON with the step, the data position, the model config and every
  parameter's shape, so a workdir whose checkpoint does not match the config is
  rejected with the differences instead of loading garbage.

Saves are asynchronous and atomic (Orbax writes a temporary directory and renames
it when complete), so a process killed mid-save leaves the previous checkpoint
as the latest one.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from vmoe_sparse_ot.train import config as config_lib
from vmoe_sparse_ot.train import partitioning

ITEMS = ('params', 'state', 'meta')


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


def _manager(workdir: str, *, max_to_keep: int | None = None, async_save: bool = True,
             read_only: bool = False) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, create=not read_only, read_only=read_only,
      enable_async_checkpointing=async_save,
      # A save cut short by a kill leaves a temporary directory; drop it on restart.
      cleanup_tmp_directories=not read_only)
  handlers = {'params': ocp.StandardCheckpointHandler(),
              'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler()}
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_handlers=handlers)


def param_shapes(params: Any) -> dict[str, list[int]]:
  """{'a/b/kernel': shape} for a params tree of arrays or ShapeDtypeStructs."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {partitioning.path_name(path): list(np.shape(leaf))
          for path, leaf in flat}


def check_compatible(meta: dict[str, Any], model_config: dict[str, Any],
                     abstract_params: Any, directory: str) -> None:
  """Raises ValueError naming what differs between a checkpoint and the config."""
  problems = []
  saved_config = meta.get('model_config', {})
  if saved_config != model_config:
    flat_saved, flat_now = config_lib.flatten(saved_config), config_lib.flatten(model_config)
    for key in sorted(set(flat_saved) | set(flat_now)):
      if flat_saved.get(key, '<absent>') != flat_now.get(key, '<absent>'):
        problems.append(f'model.{key}: checkpoint {flat_saved.get(key, "<absent>")!r}, '
                        f'config {flat_now.get(key, "<absent>")!r}')
  saved_shapes, shapes = meta.get('param_shapes', {}), param_shapes(abstract_params)
  for key in sorted(set(saved_shapes) | set(shapes)):
    if saved_shapes.get(key) != shapes.get(key):
      problems.append(f'param {key}: checkpoint shape {saved_shapes.get(key)}, '
                      f'config shape {shapes.get(key)}')
  if problems:
    shown = '\n  '.join(problems[:20])
    more = f'\n  ... and {len(problems) - 20} more' if len(problems) > 20 else ''
    raise ValueError(
        f'The checkpoint in {directory} does not match the config; use a fresh --workdir '
        f'or the config it was trained with. Differences:\n  {shown}{more}')


class Checkpointer:
  """Periodic async saves (keep the last `keep`) and resume from the latest step."""

  def __init__(self, workdir: str, *, keep: int = 2, async_save: bool = True):
    self.directory = checkpoint_dir(workdir)
    self._manager = _manager(workdir, max_to_keep=keep, async_save=async_save)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, params: Any, state: Any, meta: dict[str, Any]) -> None:
    """Starts an async save of step `step`; returns once device arrays are copied."""
    self._manager.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), state=ocp.args.StandardSave(state),
        meta=ocp.args.JsonSave(meta)), force=True)

  def restore_meta(self, step: int) -> dict[str, Any]:
    return self._manager.restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']

  def restore(self, step: int, abstract_params: Any, abstract_state: Any) -> tuple[Any, Any]:
    """Params and state of `step`, placed as the ShapeDtypeStructs' shardings say."""
    restored = self._manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params),
        state=ocp.args.StandardRestore(abstract_state)))
    return restored['params'], restored['state']

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def restore_params(workdir: str, step: int | None = None) -> tuple[Any, int]:
  """(params, step) of the checkpoint `step` (default: latest) in `workdir`.

  Arrays come back on this process's first device, whatever mesh saved them.
  Raises FileNotFoundError naming the directory when there is no checkpoint.
  """
  directory = checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'No checkpoint directory {directory}')
  manager = _manager(workdir, read_only=True)
  try:
    steps = manager.all_steps()
    if not steps:
      raise FileNotFoundError(f'No checkpoint in {directory}')
    step = manager.latest_step() if step is None else step
    if step not in steps:
      raise FileNotFoundError(f'No checkpoint for step {step} in {directory}; '
                              f'available steps: {sorted(steps)}')
    metadata = manager.item_metadata(step)['params']
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)
    restored = manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract)))
    return restored['params'], step
  finally:
    manager.close()
