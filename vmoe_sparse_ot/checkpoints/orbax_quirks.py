"""Workarounds for Orbax's logging and asyncio behaviour, in one place.

- `DropOrbaxErrors`: Orbax logs a failed background save with several
  tracebacks; the store reports it in one line.
- `write_small_arrays_whole`: small replicated arrays are written by one replica
  instead of sliced among all (one compiled program per array and device).
- `draining_loops`: the event loops Orbax creates per restore finish their
  pending reads before closing (a damaged checkpoint otherwise strands them).
- `quiet_closed_event_loop`, `quiet_abandoned_io`: a failed write leaves futures
  and callbacks that print tracebacks when collected; the failure was reported.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging as std_logging
import sys
import time
import weakref
from typing import Iterator

import jax
import orbax.checkpoint as ocp


class DropOrbaxErrors(std_logging.Filter):
  """Orbax logs a failed background save with several tracebacks; we report it in one line."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return not ('/orbax/' in record.pathname and record.levelno >= std_logging.ERROR)


# Orbax splits each replicated array among its replicas for writing, slicing it
# with one compiled program per array and device: for small arrays (biases,
# norms, a small model's everything) that costs more than it saves. The tiny
# test model on 8 devices compiled 128 slice programs (~4 s) before its first
# save. Arrays whose per-replica slice would be smaller than this are written
# whole by their first replica; large arrays are still written in parallel.
MIN_REPLICA_SLICE_BYTES = 1 << 20


def write_small_arrays_whole() -> None:
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if getattr(handler, '_min_slice_bytes_for_replica_parallel', 0) is None:
    # The registered handler's own settings (its array metadata store) are kept.
    handler._min_slice_bytes_for_replica_parallel = MIN_REPLICA_SLICE_BYTES  # pylint: disable=protected-access


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

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    # Every task of this loop, finished or not: a read that failed before the
    # restore raised, or one started while draining, is in no `all_tasks` list
    # at close time, yet its exception must be retrieved too.
    self._tasks: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()
    self.set_task_factory(self._tracked_task)

  def _tracked_task(self, loop, coro, **kwargs):
    task = asyncio.Task(coro, loop=loop, **kwargs)
    self._tasks.add(task)
    return task

  def close(self) -> None:
    if not self.is_running() and not self.is_closed():
      # Reads of a damaged checkpoint end quickly; the bound is a safeguard.
      deadline = time.monotonic() + _DRAIN_TIMEOUT_S
      while time.monotonic() < deadline:
        pending = [task for task in asyncio.all_tasks(self) if not task.done()]
        if not pending:
          break
        self.run_until_complete(asyncio.wait(pending, timeout=deadline - time.monotonic()))
      # Their failures belong to the restore that already raised: retrieved here,
      # they are not logged again ("Task exception was never retrieved") when the
      # tasks are collected.
      for task in list(self._tasks):
        if task.done() and not task.cancelled():
          task.exception()
    super().close()


class _DrainingPolicy(asyncio.DefaultEventLoopPolicy):
  _loop_factory = _DrainingEventLoop


@contextlib.contextmanager
def draining_loops() -> Iterator[None]:
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


def quiet_closed_event_loop() -> None:
  if not getattr(sys.unraisablehook, 'quiet_closed_event_loop', False):
    sys.unraisablehook = _unraisable_hook(sys.unraisablehook)


def quiet_abandoned_io(step_dir: str) -> None:
  """A failed Orbax write under `step_dir` leaves futures that complain, with
  tracebacks, when collected (often at exit); the failure was reported in one line.
  (Failed reads leave none: see `_DrainingEventLoop`.)"""
  if _ABANDONED_READS not in std_logging.getLogger('asyncio').filters:
    std_logging.getLogger('asyncio').addFilter(_ABANDONED_READS)
  _ABANDONED_READS.paths.add(step_dir.rstrip('/') + '/')
  quiet_closed_event_loop()
