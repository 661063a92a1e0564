"""The read-only API every job uses: a run's parameters, metadata and router state.

Never writes: a damaged newest step is skipped with a warning (the trainer that
owns the workdir moves it aside).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator

import jax
import orbax.checkpoint as ocp
from absl import logging

from vmoe_sparse_ot.checkpoints import layout
from vmoe_sparse_ot.trees import leaf_shapes
from vmoe_sparse_ot.checkpoints import orbax_quirks
from vmoe_sparse_ot.checkpoints import store
from vmoe_sparse_ot.errors import CheckpointRestoreError


def param_shapes(params: Any) -> dict[str, list[int]]:
  """{'a/b/kernel': shape} for a params tree of arrays or ShapeDtypeStructs (the
  record's 'param_shapes')."""
  return leaf_shapes(params)


@contextlib.contextmanager
def _read_only(workdir: str, step: int | None) -> Iterator[ocp.CheckpointManager]:
  """A read-only manager of `workdir`'s checkpoints, closed on leaving on every path."""
  directory = layout.checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    raise CheckpointRestoreError(f'No checkpoint directory {directory}')
  manager = store.open_manager(workdir, read_only=True)
  try:
    steps = manager.all_steps()
    if not steps:
      raise CheckpointRestoreError(f'No checkpoint in {directory}')
    if step is not None and step not in steps:
      raise CheckpointRestoreError(f'No checkpoint for step {step} in {directory}; available '
                                   f'steps: {sorted(steps)}')
    yield manager
  finally:
    manager.close()


def _restore_read_only(workdir: str, step: int | None,
                       restore: Callable[[ocp.CheckpointManager, int], Any]):
  """(meta, restored, step): `step`, or the newest that restores (damaged ones skipped)."""
  directory = layout.checkpoint_dir(workdir)
  with _read_only(workdir, step) as manager:
    if step is not None:
      try:
        with orbax_quirks.draining_loops():
          return store.read_meta_item(manager, step), restore(manager, step), step
      except Exception as e:  # pylint: disable=broad-except
        raise CheckpointRestoreError(
            f'Checkpoint step {step} in {directory} does not restore ({store.reason(e)})') from None
    good, restored, damaged = store.newest_restorable(
        manager, directory, lambda s: restore(manager, s), None)
    for bad, reason in damaged:
      # Read-only: a trainer may own the workdir; it moves the damaged step aside.
      logging.warning('Checkpoint step %d in %s is damaged (%s); using step %d.', bad,
                      directory, reason, good)
    meta, arrays = restored
    return meta, arrays, good


def restore_params_with_meta(workdir: str, step: int | None = None
                             ) -> tuple[Any, dict[str, Any], int]:
  """(params, metadata, step) of checkpoint `step` (default: the newest that restores).

  Arrays come back on this process's first device, whatever mesh saved them.
  Metadata holds 'model_config' (the model the params belong to), 'step',
  'param_shapes', 'data', 'optimizer', 'schedule' and 'train_steps'. With
  step=None a damaged newest checkpoint is skipped (one warning line) for the one
  before; params and metadata always come from the same step. Raises
  CheckpointRestoreError (a FileNotFoundError) naming the directory when there is
  no checkpoint or none restores.
  """
  def restore(manager, s):
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    metadata = manager.item_metadata(s)['params']
    abstract = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)
    return store.restore_step(manager, s, abstract, None)[0]

  meta, params, step = _restore_read_only(workdir, step, restore)
  return params, meta, step


def read_meta(workdir: str, step: int | None = None) -> tuple[dict[str, Any], int]:
  """(metadata, step) of checkpoint `step` (default: the newest whose metadata reads).

  Read-only and cheap (no arrays): for tools that only need the run's model config.
  """
  meta, _, step = _restore_read_only(workdir, step, lambda manager, s: None)
  return meta, step


def restore_model_state(workdir: str, step: int) -> dict[str, Any]:
  """The TrainState's `model_state` saved at `step` ({} for a run without router
  state), on this process's first device: what evaluation routes with."""
  def restore(manager, s):
    metadata = manager.item_metadata(s).get('model_state')
    if metadata is None:
      return {}
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)
    return manager.restore(s, args=ocp.args.Composite(
        model_state=ocp.args.StandardRestore(abstract)))['model_state']

  _, model_state, _ = _restore_read_only(workdir, step, restore)
  return model_state


def restore_params(workdir: str, step: int | None = None) -> tuple[Any, int]:
  """(params, step): `restore_params_with_meta` without the metadata."""
  params, _, step = restore_params_with_meta(workdir, step)
  return params, step
