"""Orbax checkpoints of a TrainState under `WORKDIR/checkpoints`.

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

import asyncio
import contextlib
import glob
import logging as std_logging
import os
import shutil
import sys
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from vmoe_sparse_ot.nn.config import without_compute_keys
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train.errors import CheckpointRestoreError
from vmoe_sparse_ot.train.errors import CheckpointWriteError
from vmoe_sparse_ot.train.errors import ResumeMismatchError
from vmoe_sparse_ot.train.state import TrainState

ITEMS = ('params', 'state', 'meta', 'model_state')
TMP_PATTERN = '*.orbax-checkpoint-tmp*'
CORRUPT_SUFFIX = '.corrupt'
# Messages of writes that failed for lack of space (errno ENOSPC, EDQUOT, EFBIG;
# tensorstore reports them as ValueError text with the OS error code).
_DISK_FULL_HINTS = ('No space left', 'File too large', 'Disk quota', "os_error_code='28'",
                    "os_error_code='27'", "os_error_code='122'")


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), 'checkpoints')


class _DropOrbaxErrors(std_logging.Filter):
  """Orbax logs a failed background save with several tracebacks; we report it in one line."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not ('/orbax/' in record.pathname and record.levelno >= std_logging.ERROR)


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


# Orbax splits each replicated array among its replicas for writing, slicing it
# with one compiled program per array and device: for small arrays (biases,
# norms, a small model's everything) that costs more than it saves. The tiny
# test model on 8 devices compiled 128 slice programs (~4 s) before its first
# save. Arrays whose per-replica slice would be smaller than this are written
# whole by their first replica; large arrays are still written in parallel.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def _write_small_arrays_whole() -> None:
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if getattr(handler, '_min_slice_bytes_for_replica_parallel', 0) is None:
    # The registered handler's own settings (its array metadata store) are kept.
    handler._min_slice_bytes_for_replica_parallel = MIN_REPLICA_SLICE_BYTES  # pylint: disable=protected-access


def _manager(workdir: str, *, preservation_policy: Any = None, async_save: bool = True,
             read_only: bool = False) -> ocp.CheckpointManager:
  _write_small_arrays_whole()
  options = ocp.CheckpointManagerOptions(
      preservation_policy=preservation_policy, create=not read_only, read_only=read_only,
      enable_async_checkpointing=async_save, cleanup_tmp_directories=not read_only)
  handlers = {'params': ocp.StandardCheckpointHandler(),
              'state': ocp.StandardCheckpointHandler(), 'meta': ocp.JsonCheckpointHandler(),
              'model_state': ocp.StandardCheckpointHandler()}
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options,
                               item_handlers=handlers)


def _reason(error: BaseException) -> str:
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


def param_shapes(params: Any) -> dict[str, list[int]]:
  """{'a/b/kernel': shape} for a params tree of arrays or ShapeDtypeStructs."""
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {parallel.path_name(path): list(np.shape(leaf))
          for path, leaf in flat}


def _differences(saved: Any, now: Any, prefix: str) -> list[str]:
  flat_saved = config_lib.flatten(saved or {}) if isinstance(saved, dict) else {'': saved}
  flat_now = config_lib.flatten(now or {}) if isinstance(now, dict) else {'': now}
  out = []
  for key in sorted(set(flat_saved) | set(flat_now)):
    a, b = flat_saved.get(key, '<absent>'), flat_now.get(key, '<absent>')
    if a != b:
      out.append(f'{prefix}{"." + key if key else ""}: checkpoint {a!r}, config {b!r}')
  return out


def _join(problems: list[str], limit: int = 12) -> str:
  more = f'; ... and {len(problems) - limit} more' if len(problems) > limit else ''
  return '; '.join(problems[:limit]) + more


def check_compatible(meta: dict[str, Any], model_config: dict[str, Any],
                     abstract_params: Any, directory: str) -> None:
  """Raises ResumeMismatchError naming what differs between a checkpoint and the model."""
  # model.dtype / model.remat change how the model computes, not its parameters.
  problems = _differences(without_compute_keys(meta.get('model_config') or {}),
                          without_compute_keys(model_config), 'model')
  saved_shapes, shapes = meta.get('param_shapes', {}), param_shapes(abstract_params)
  for key in sorted(set(saved_shapes) | set(shapes)):
    if saved_shapes.get(key) != shapes.get(key):
      problems.append(f'param {key}: checkpoint shape {saved_shapes.get(key)}, '
                      f'config shape {shapes.get(key)}')
  if problems:
    raise ResumeMismatchError(
        f'The checkpoint in {directory} does not match the config; use a fresh --workdir '
        f'or the config it was trained with. Differences: {_join(problems)}')


_SAMPLING_HINT = ("(A checkpoint without dataset.sampling read its data with "
                  "config.dataset.sampling='stream': set it to resume.) ")


def check_resume(meta: dict[str, Any], expected: dict[str, Any], directory: str, *,
                 allow_schedule_change: bool = False) -> list[str]:
  """Compares the input stream, optimizer and schedule of a checkpoint with this run.

  `expected` holds this run's 'data', 'optimizer', 'schedule' and 'train_steps'.
  A different input stream or optimizer always fails (the optimizer state would
  not fit or would mean something else); a different schedule or train_steps
  fails unless `allow_schedule_change`, and is then returned, to be logged.
  A key the checkpoint does not record is not compared.
  """
  step = meta.get('step', '?')
  if 'data' in meta and meta['data'] != expected['data']:
    raise ResumeMismatchError(
        f'The checkpoint in {directory} was trained on a different input stream: '
        f'{_join(_differences(meta["data"], expected["data"], "dataset"))}. '
        f'{_SAMPLING_HINT if "sampling" not in meta["data"] else ""}Use a fresh --workdir.')
  if 'optimizer' in meta:
    changed = _differences(meta['optimizer'], expected['optimizer'], 'optimizer')
    if changed:
      raise ResumeMismatchError(
          f'Cannot resume from step {step} in {directory}: the optimizer differs from the '
          f'checkpoint\'s: {_join(changed)}. Use the checkpoint\'s optimizer settings or a '
          'fresh --workdir.')
  changed = []
  if 'schedule' in meta:
    changed += _differences(meta['schedule'], expected['schedule'], 'schedule')
  if 'train_steps' in meta:
    changed += _differences(meta['train_steps'], expected['train_steps'], 'train_steps')
  if changed and not allow_schedule_change:
    raise ResumeMismatchError(
        f'Resuming from step {step} in {directory} would change the learning-rate schedule: '
        f'{_join(changed)}. Pass allow_schedule_change (main: --allow_schedule_change) to '
        'continue with the new one, or use the checkpoint\'s values.')
  return changed


def _restore_step(manager: ocp.CheckpointManager, step: int, abstract_params: Any,
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


def _read_meta(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
  meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))['meta']
  if not isinstance(meta, dict):
    raise ValueError(f'metadata is {type(meta).__name__}, not a JSON object')
  return meta


_DRAIN_TIMEOUT_S = 60.0


class _DrainingEventLoop(asyncio.SelectorEventLoop):
  """An event loop that lets its unfinished tasks complete before it closes.

  Orbax runs each restore in a fresh loop and closes it as soon as the restore
  coroutine returns. When one array of a damaged checkpoint fails to read,
  `asyncio.gather` raises at once while tensorstore still reads the others; a
  plain close strands those tasks, and their completion callbacks later hit the
  closed loop ("RuntimeError: Event loop is closed", a traceback on stderr when
  that happens while the interpreter exits). Draining them here ends every read
  before the restore call returns.
  """

  def close(self) -> None:
    if not self.is_running() and not self.is_closed():
      pending = [task for task in asyncio.all_tasks(self) if not task.done()]
      if pending:  # Reads of a damaged checkpoint end quickly; the bound is a safeguard.
        self.run_until_complete(asyncio.wait(pending, timeout=_DRAIN_TIMEOUT_S))
    super().close()


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
  _loop_factory = _DrainingEventLoop


@contextlib.contextmanager
def _draining_loops() -> Iterator[None]:
  """Event loops created inside (Orbax makes one per restore) drain before closing."""
  previous = asyncio.get_event_loop_policy()
  asyncio.set_event_loop_policy(_DrainingPolicy())
  try:
    yield
  finally:
    asyncio.set_event_loop_policy(previous)


class _DropAbandonedReads(std_logging.Filter):
  """asyncio's "exception was never retrieved" for failed writes under `paths`."""

  def __init__(self):
    super().__init__()
    self.paths: set[str] = set()

  def filter(self, record: std_logging.LogRecord) -> bool:
    message = record.getMessage()
    return not ('exception was never retrieved' in message
                and any(path in message for path in self.paths))


_ABANDONED_READS = _DropAbandonedReads()


def _unraisable_hook(default):
  def hook(info):
    if not (isinstance(info.exc_value, RuntimeError)
            and 'Event loop is closed' in str(info.exc_value)):
      default(info)
  hook.quiet_closed_event_loop = True
  return hook


def _quiet_closed_event_loop() -> None:
  if not getattr(sys.unraisablehook, 'quiet_closed_event_loop', False):
    sys.unraisablehook = _unraisable_hook(sys.unraisablehook)


def _quiet_abandoned_io(step_dir: str) -> None:
  """A failed Orbax write under `step_dir` leaves futures that complain, with
  tracebacks, when collected (often at exit); the failure was reported in one line.
  (Failed reads leave none: see `_DrainingEventLoop`.)"""
  if _ABANDONED_READS not in std_logging.getLogger('asyncio').filters:
    std_logging.getLogger('asyncio').addFilter(_ABANDONED_READS)
  _ABANDONED_READS.paths.add(step_dir.rstrip('/') + '/')
  _quiet_closed_event_loop()


def _all_processes_ok(ok: bool) -> bool:
  """Every process must take the same step: one failing read fails it for all."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def _newest_restorable(manager, directory: str, restore: Callable[[int], Any],
                       check_meta: Callable[[dict[str, Any]], None] | None):
  """(step, (meta, restored), damaged) for the newest step whose meta and arrays read.

  `damaged` lists (step, reason) of newer steps that failed. A `check_meta`
  error (the checkpoint is intact but does not fit) propagates. Raises
  CheckpointRestoreError when steps exist but none reads; (None, None, []) when
  there is none.
  """
  with _draining_loops():
    return _search(manager, directory, restore, check_meta)


def _search(manager, directory, restore, check_meta):
  damaged = []
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      meta = _read_meta(manager, step)
      error = None
    except Exception as e:  # pylint: disable=broad-except
      meta, error = None, e
    if not _all_processes_ok(error is None):
      damaged.append((step, _reason(error) if error else 'failed on another process'))
      continue
    if check_meta is not None:
      check_meta(meta)
    try:
      restored, error = restore(step), None
    except Exception as e:  # pylint: disable=broad-except
      restored, error = None, e
    if not _all_processes_ok(error is None):
      damaged.append((step, _reason(error) if error else 'failed on another process'))
      continue
    return step, (meta, restored), damaged
  if damaged:
    raise CheckpointRestoreError(
        f'No checkpoint in {directory} restores: step(s) {[s for s, _ in damaged]} are damaged '
        f'(step {damaged[0][0]}: {damaged[0][1]}); move them away to start afresh.')
  return None, None, damaged


def _move_aside(directory: str, step: int) -> str:
  target = os.path.join(directory, f'{step}{CORRUPT_SUFFIX}')
  if os.path.exists(target):
    target += f'-{int(time.time())}'
  os.rename(os.path.join(directory, str(step)), target)
  return target


def remove_unfinished_saves(directory: str) -> list[str]:
  """Deletes `*.orbax-checkpoint-tmp*` folders left by a save that never completed."""
  removed = []
  for path in sorted(glob.glob(os.path.join(directory, TMP_PATTERN))):
    shutil.rmtree(path, ignore_errors=True)
    removed.append(os.path.basename(path))
  return removed


class Checkpointer:
  """Periodic async saves of a TrainState and fault-tolerant resume.

  Rotation keeps the last `keep` steps and the newest verified-good one (see
  `_NewestVerified`), which `last_good` names after a divergence.
  """

  def __init__(self, workdir: str, *, keep: int = 2, async_save: bool = True):
    self.directory = checkpoint_dir(workdir)
    # The newest `keep` steps, and the newest verified-good one even when older.
    policy = ocp.checkpoint_managers.AnyPreservationPolicy([
        ocp.checkpoint_managers.LatestN(keep),
        _NewestVerified(lambda: self._finite_through)])
    self._options = dict(preservation_policy=policy, async_save=async_save)
    self._workdir = workdir
    if jax.process_index() == 0 and os.path.isdir(self.directory):
      removed = remove_unfinished_saves(self.directory)
      if removed:
        logging.warning('Removed %d unfinished checkpoint folder(s) in %s: %s',
                        len(removed), self.directory, ', '.join(removed))
    self._log_filter = _DropOrbaxErrors()
    std_logging.getLogger('absl').addFilter(self._log_filter)
    # A failed write (e.g. a full disk) leaves tensorstore callbacks that hit
    # Orbax's closed event loop, each printing a traceback.
    _quiet_closed_event_loop()
    self._manager = _manager(workdir, **self._options)
    # A step is saved only once the losses through it were checked finite (see
    # `save`), so every checkpoint older than the newest one on disk is verified.
    self._finite_through = self._manager.latest_step() or 0
    self._pending_step: int | None = None
    self._write_failed_once = False

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def last_good(self, first_bad_step: int) -> str:
    """Where to resume when the loss of `first_bad_step` was the first non-finite one.

    One or two sentences: the newest checkpoint whose next step's loss was finite
    (a step <= first_bad_step - 2, since step t's loss comes from the parameters
    saved at t - 1), the newer steps to move away so that a relaunch resumes from
    it, and that the learning rate must change; or that none is known good.
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
    move = (f'move the later step(s) {", ".join(map(str, later))} out of that folder and '
            if later else '')
    return (f"The last good checkpoint is step {good} in {self.directory} (its next step's "
            f'loss was finite); {move}relaunch with a lower learning rate '
            '(config.schedule.peak_value, and --allow_schedule_change): the same one diverges '
            'again.')

  def save(self, step: int, state: TrainState, meta: dict[str, Any]) -> None:
    """Starts an async save of `state`; returns once device arrays are copied.

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
    _quiet_abandoned_io(self.directory)
    self._manager.reload()
    saved = [s for s in self._manager.all_steps() if s != step]
    last = f'step {max(saved)}' if saved else 'none'
    cause = ('the disk is full or a file-size limit was reached'
             if is_disk_full(error) else 'the write failed')
    raise CheckpointWriteError(
        f'Writing checkpoint step {step} to {self.directory} failed: {cause} ({_reason(error)}). '
        f'The last good checkpoint is {last}; its partial folder is removed at the next '
        'start.') from error

  def wait(self) -> None:
    """Waits for a save in flight; raises CheckpointWriteError if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      self._write_failed(e)
    self._pending_step = None

  def restore(self, abstract_state: TrainState,
              check_meta: Callable[[dict[str, Any]], None] | None = None,
              ) -> tuple[TrainState | None, dict[str, Any] | None]:
    """(state, meta) of the newest checkpoint that restores; (None, None) if none exists.

    `abstract_state`: ShapeDtypeStructs with shardings. `check_meta(meta)` runs
    before any array is read and may raise to refuse the checkpoint. Damaged newer
    checkpoints are renamed `N.corrupt` (one warning line each). Raises
    CheckpointRestoreError when checkpoints exist but none restores.
    """
    rest = {'opt_state': abstract_state.opt_state, 'rng': abstract_state.rng,
            'step': abstract_state.step}
    step, restored, damaged = _newest_restorable(
        self._manager, self.directory,
        lambda s: _restore_step(self._manager, s, abstract_state.params, rest,
                                abstract_state.model_state), check_meta)
    if damaged:
      for bad, reason in damaged:
        target = _move_aside(self.directory, bad) if jax.process_index() == 0 else '?'
        logging.warning('Checkpoint step %d in %s is damaged (%s); moved it to %s and resumed '
                        'from step %d.', bad, self.directory, reason,
                        os.path.basename(target), step)
      if jax.process_count() > 1:
        from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
        multihost_utils.sync_global_devices('checkpoints_moved_aside')
      self._manager.close()  # Forget the renamed steps.
      self._manager = _manager(self._workdir, **self._options)
    if step is None:
      return None, None
    meta, (params, rest) = restored
    return TrainState(params=params, opt_state=rest['opt_state'], rng=rest['rng'],
                      step=rest['step'], model_state=rest.get('model_state', {})), meta

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self._manager.close()
      # After a failed save, Orbax's threads may still log errors until the
      # process exits; the failure was reported in one line.
      if not self._write_failed_once:
        std_logging.getLogger('absl').removeFilter(self._log_filter)


@contextlib.contextmanager
def _read_only(workdir: str, step: int | None) -> Iterator[ocp.CheckpointManager]:
  """A read-only manager of `workdir`'s checkpoints, closed on leaving on every path."""
  directory = checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    raise CheckpointRestoreError(f'No checkpoint directory {directory}')
  manager = _manager(workdir, read_only=True)
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
  directory = checkpoint_dir(workdir)
  with _read_only(workdir, step) as manager:
    if step is not None:
      try:
        with _draining_loops():
          return _read_meta(manager, step), restore(manager, step), step
      except Exception as e:  # pylint: disable=broad-except
        raise CheckpointRestoreError(
            f'Checkpoint step {step} in {directory} does not restore ({_reason(e)})') from None
    good, restored, damaged = _newest_restorable(
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
    return _restore_step(manager, s, abstract, None)[0]

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
