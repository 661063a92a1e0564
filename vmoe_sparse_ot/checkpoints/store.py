"""The Orbax store of a training state under `WORKDIR/checkpoints`: saves and resume.

Each step directory holds three items (four with router state):
- 'params': the model parameters (sharded arrays, written by every process), on
  their own so that the few-shot job reads them without the optimizer;
- 'state': the rest of the TrainState: {'opt_state', 'rng', 'step'};
- 'model_state' (only for a model with router state, e.g. topk_bias): the
  TrainState's `model_state`, {'router_state': per-layer state}, on its own so
  that readers of the params can route as the trainer does
  (`restore_model_state`); a run without state writes no such item, so its
  checkpoints are what they always were;
- 'meta': JSON with 'step', 'model_config', 'param_shapes', 'data' (what fixes the
  input stream's position), 'optimizer', 'schedule' and 'train_steps', so that a
  workdir whose checkpoint does not fit the config is refused with the
  differences named, before any array is read.

Saves are asynchronous and atomic (Orbax writes `N.orbax-checkpoint-tmp*` and
renames it when complete), so a process killed mid-save leaves the previous
checkpoint as the latest one; leftover temporary folders are removed at the next
start. A checkpoint that fails to restore is damaged: the trainer moves it aside
(`N.corrupt`) and resumes from the newest one that restores.
"""
from __future__ import annotations

import logging as std_logging
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from jax.experimental import multihost_utils

from vmoe_sparse_ot.checkpoints import layout
from vmoe_sparse_ot.checkpoints import orbax_quirks
from vmoe_sparse_ot.errors import CheckpointRestoreError
from vmoe_sparse_ot.errors import CheckpointWriteError

# Messages of writes that failed for lack of space (errno ENOSPC, EDQUOT, EFBIG;
# tensorstore reports them as ValueError text with the OS error code).
_DISK_FULL_HINTS = ('No space left', 'File too large', 'Disk quota', "os_error_code='28'",
                    "os_error_code='27'", "os_error_code='122'")


class _NewestVerified:
  """Orbax preservation policy: keeps the newest checkpoint known to be good.

  The loss of step t is computed from the parameters saved at step t - 1, so
  checkpoint s is verified good once the loss of step s + 1 is known finite, i.e.
  when s < `finite_through()` (the last step whose loss was checked finite). The
  newest checkpoint is never verified when it is written; without this policy
  `max_to_keep` rotation would delete the one a diverged run must resume from.
  """

  def __init__(self, finite_through: Callable[[], int]):
    self._finite_through = finite_through

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
    del context
    through = self._finite_through()
    verified = [info.step for info in checkpoints if info.step < through]
    newest = max(verified, default=None)
    return [info.step == newest for info in checkpoints]


def open_manager(workdir: str, *, preservation_policy: Any = None, async_save: bool = True,
             read_only: bool = False) -> ocp.CheckpointManager:
  orbax_quirks.write_small_arrays_whole()
  options = ocp.CheckpointManagerOptions(
      preservation_policy=preservation_policy, create=not read_only, read_only=read_only,
      enable_async_checkpointing=async_save, cleanup_tmp_directories=not read_only)
  handlers = {'params': ocp.StandardCheckpointHandler(),
              'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler(),
              'model_state': ocp.StandardCheckpointHandler()}
  return ocp.CheckpointManager(layout.checkpoint_dir(workdir), options=options,
                               item_handlers=handlers)


def reason(error: BaseException) -> str:
  """One short line describing an exception."""
  text = ' '.join(str(error).split())
  text = text.split(' [tensorstore_spec=')[0].split(' See full TensorStore details')[0]
  return f'{type(error).__name__}: {text[:200]}{"..." if len(text) > 200 else ""}'


def is_disk_full(error: BaseException) -> bool:
  seen = error
  while seen is not None:
    if isinstance(seen, OSError) and seen.errno in (28, 27, 122):
      return True
    if any(hint in str(seen) for hint in _DISK_FULL_HINTS):
      return True
    seen = seen.__cause__ or seen.__context__
  return False


def restore_step(manager: ocp.CheckpointManager, step: int, abstract_params: Any,
                  abstract_state: Any | None, abstract_model_state: Any = None
                  ) -> tuple[Any, Any]:
  """(params, rest): rest (None without `abstract_state`) holds 'model_state' when
  `abstract_model_state` is a non-empty tree."""
  args = {'params': ocp.args.StandardRestore(abstract_params)}
  if abstract_state is not None:
    args['state'] = ocp.args.StandardRestore(abstract_state)
  if abstract_model_state:
    args['model_state'] = ocp.args.StandardRestore(abstract_model_state)
  restored = manager.restore(step, args=ocp.args.Composite(**args))
  if abstract_state is None:
    return restored['params'], None
  rest = dict(restored['state'])
  if abstract_model_state:
    rest['model_state'] = restored['model_state']
  return restored['params'], rest


def read_meta_item(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
  meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']
  if not isinstance(meta, dict):
    raise ValueError(f'metadata is {type(meta).__name__}, not a JSON object')
  return meta


def _all_processes_ok(ok: bool) -> bool:
  """Every process must take the same step: one failing read fails it for all."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def newest_restorable(manager, directory: str, restore: Callable[[int], Any],
                       check_meta: Callable[[dict[str, Any]], None] | None):
  """(step, (meta, restored), damaged) for the newest step whose meta and arrays read.

  `damaged` lists (step, reason) of newer steps that failed. A `check_meta`
  error (the checkpoint is intact but does not fit) propagates. Raises
  CheckpointRestoreError when steps exist but none reads; (None, None, []) when
  there is none.
  """
  with orbax_quirks.draining_loops():
    return _search(manager, directory, restore, check_meta)


def _search(manager, directory, restore, check_meta):
  damaged = []
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      meta = read_meta_item(manager, step)
      error = None
    except Exception as e:  # pylint: disable=broad-except
      meta, error = None, e
    if not _all_processes_ok(error is None):
      damaged.append((step, reason(error) if error else 'failed on another process'))
      continue
    if check_meta is not None:
      check_meta(meta)
    try:
      restored, error = restore(step), None
    except Exception as e:  # pylint: disable=broad-except
      restored, error = None, e
    if not _all_processes_ok(error is None):
      damaged.append((step, reason(error) if error else 'failed on another process'))
      continue
    return step, (meta, restored), damaged
  if damaged:
    raise CheckpointRestoreError(
        f'No checkpoint in {directory} restores: step(s) {[s for s, _ in damaged]} are damaged '
        f'(step {damaged[0][0]}: {damaged[0][1]}); move them away to start afresh.')
  return None, None, damaged


class Checkpointer:
  """Periodic async saves of a TrainState and fault-tolerant resume.

  Rotation keeps the last `keep` steps and the newest verified-good one (see
  `_NewestVerified`), which `last_good` names, and resumes from, after a divergence;
  with `keep_steps_multiple_of` > 0 also every step that is a multiple of it, forever.
  """

  def __init__(self, workdir: str, *, keep: int = 2, async_save: bool = True,
               keep_steps_multiple_of: int = 0):
    self.directory = layout.checkpoint_dir(workdir)
    # The newest `keep` steps, and the newest verified-good one even when older.
    policies = [ocp.checkpoint_managers.LatestN(keep),
                _NewestVerified(lambda: self._finite_through)]
    if keep_steps_multiple_of > 0:  # Orbax's: steps with step % N == 0.
      policies.append(ocp.checkpoint_managers.EveryNSteps(keep_steps_multiple_of))
    policy = ocp.checkpoint_managers.AnyPreservationPolicy(policies)
    self._options = dict(preservation_policy=policy, async_save=async_save)
    self._workdir = workdir
    if jax.process_index() == 0 and os.path.isdir(self.directory):
      removed = layout.remove_unfinished_saves(self.directory)
      if removed:
        logging.warning('Removed %d unfinished checkpoint folder(s) in %s: %s',
                        len(removed), self.directory, ', '.join(removed))
    self._log_filter = orbax_quirks.DropOrbaxErrors()
    std_logging.getLogger('absl').addFilter(self._log_filter)
    # A failed write (e.g. a full disk) leaves tensorstore callbacks that hit
    # Orbax's closed event loop, each printing a traceback.
    orbax_quirks.quiet_closed_event_loop()
    self._manager = open_manager(workdir, **self._options)
    # A step is saved only once the losses through it were checked finite (see
    # `save`), so every checkpoint older than the newest one on disk is verified.
    self._finite_through = self._manager.latest_step() or 0
    self._pending_step: int | None = None
    self._write_failed_once = False

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def last_good(self, first_bad_step: int) -> str:
    """Sets aside the steps after the last good one; says where to resume, in one line.

    The loss of `first_bad_step` was the first non-finite one. The last good
    checkpoint is the newest whose next step's loss was finite (a step <=
    first_bad_step - 2, since step t's loss comes from the parameters saved at
    t - 1). Newer steps are renamed `N.diverged` (`layout.DIVERGED_SUFFIX`), so
    that a relaunch resumes from the good one; the sentence names them and says
    that the learning rate must change, or that no checkpoint is known good.
    Waits for a save in flight first.
    """
    try:
      self.wait()
    except CheckpointWriteError:
      pass  # Reported by whoever waits next; the steps on disk are what counts here.
    steps = sorted(self._manager.all_steps())
    good = max((s for s in steps if s <= first_bad_step - 2), default=None)
    if good is None:
      return (f'No checkpoint is known to be good (none precedes step {first_bad_step - 1}, '
              'whose parameters gave the non-finite loss): restart from scratch in a fresh '
              '--workdir with a lower learning rate (config.schedule.peak_value) or gradient '
              'clipping (config.optimizer.gradient_clip_norm).')
    later = [s for s in steps if s > good]
    moved = self._set_aside(later, layout.DIVERGED_SUFFIX)
    aside = (f'the later step(s) {", ".join(map(str, later))} led to it and were moved to '
             f'{", ".join(moved)}, so a relaunch resumes from step {good}; ' if later else '')
    return (f"The last good checkpoint is step {good} in {self.directory} (its next step's "
            f'loss was finite); {aside}relaunch with a lower learning rate '
            '(config.schedule.peak_value, and --allow_schedule_change): the same one diverges '
            'again.')

  def _set_aside(self, steps: Sequence[int], suffix: str) -> list[str]:
    """Renames step folders (process 0), then reopens the store; the new folder names."""
    if not steps:
      return []
    moved = [os.path.basename(layout.move_aside(self.directory, s, suffix))
             if jax.process_index() == 0 else f'{s}{suffix}' for s in steps]
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices('checkpoints_set_aside')
    self._manager.close()  # Forget the renamed steps.
    self._manager = open_manager(self._workdir, **self._options)
    return moved

  def save(self, step: int, state: Any, meta: dict[str, Any]) -> None:
    """Starts an async save of `state`; returns once device arrays are copied.

    `state`: a training state with fields params, opt_state, rng, step and
    model_state (`train.state.TrainState`); `meta` a JSON-able dict.

    Call it only once the losses of steps <= `step` are known finite (the trainer
    checks first): that verifies the older checkpoints, and rotation keeps the
    newest of them.
    """
    self.wait()  # Reports a failure of the previous save before starting a new one.
    self._finite_through = max(self._finite_through, step)
    rest = {'opt_state': state.opt_state, 'rng': state.rng, 'step': state.step}
    items = {'params': ocp.args.StandardSave(state.params),
             'state': ocp.args.StandardSave(rest), 'meta': ocp.args.JsonSave(meta)}
    if state.model_state:
      items['model_state'] = ocp.args.StandardSave(state.model_state)
    self._pending_step = step
    try:
      self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:  # pylint: disable=broad-except
      self._write_failed(e)

  def _write_failed(self, error: BaseException) -> None:
    step, self._pending_step = self._pending_step, None
    self._write_failed_once = True
    orbax_quirks.quiet_abandoned_io(self.directory)
    self._manager.reload()
    saved = [s for s in self._manager.all_steps() if s != step]
    last = f'step {max(saved)}' if saved else 'none'
    cause = ('the disk is full or a file-size limit was reached'
             if is_disk_full(error) else 'the write failed')
    raise CheckpointWriteError(
        f'Writing checkpoint step {step} to {self.directory} failed: {cause} ({reason(error)}). '
        f'The last good checkpoint is {last}; its partial folder is removed at the next '
        'start.') from error

  def wait(self) -> None:
    """Waits for a save in flight; raises CheckpointWriteError if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      self._write_failed(e)
    self._pending_step = None

  def restore(self, abstract_state: Any,
              check_meta: Callable[[dict[str, Any]], None] | None = None,
              ) -> tuple[Any, dict[str, Any] | None]:
    """(state, meta) of the newest checkpoint that restores; (None, None) if none exists.

    `abstract_state`: a training state (a flax struct dataclass with the fields
    `save` writes) of ShapeDtypeStructs with shardings; the state comes back as
    that type. `check_meta(meta)` runs
    before any array is read and may raise to refuse the checkpoint. Damaged newer
    checkpoints are renamed `N.corrupt` (one warning line each). Raises
    CheckpointRestoreError when checkpoints exist but none restores.
    """
    rest = {'opt_state': abstract_state.opt_state, 'rng': abstract_state.rng,
            'step': abstract_state.step}
    step, restored, damaged = newest_restorable(
        self._manager, self.directory,
        lambda s: restore_step(self._manager, s, abstract_state.params, rest,
                                abstract_state.model_state), check_meta)
    moved = self._set_aside([bad for bad, _ in damaged], layout.CORRUPT_SUFFIX)
    for (bad, reason), target in zip(damaged, moved):
      logging.warning('Checkpoint step %d in %s is damaged (%s); moved it to %s and resumed '
                      'from step %d.', bad, self.directory, reason, target, step)
    if step is None:
      return None, None
    meta, (params, rest) = restored
    return abstract_state.replace(
        params=params, opt_state=rest['opt_state'], rng=rest['rng'], step=rest['step'],
        model_state=rest.get('model_state', {})), meta

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._manager.close()
      # After a failed save, Orbax's threads may still log errors until the
      # process exits; the failure was reported in one line.
      if not self._write_failed_once:
        std_logging.getLogger('absl').removeFilter(self._log_filter)
