"""One trainer per workdir: an exclusive `fcntl.flock` on `WORKDIR/.lock`.

The kernel drops a flock when its holder exits, however it exits (SIGKILL
included), so a lock file left by a dead process is not locked: the next trainer
takes it over and says whose it was. The file records the holder's pid, host and
start time so that the refusal can name them.

In a multi-process run every process locks its own file (`.lock` for process 0,
`.lock.process-I` for the others): two processes of one run never contend, and
any process of a second run on the same workdir is refused.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket

from absl import logging

from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot.errors import WorkdirLockedError


def lock_path(workdir: str, process_index: int = 0) -> str:
  name = (workdir_layout.LOCK if process_index == 0
          else f'{workdir_layout.LOCK}.process-{process_index}')
  return os.path.join(workdir, name)


def _read_holder(fd: int) -> dict:
  os.lseek(fd, 0, os.SEEK_SET)
  text = os.read(fd, 4096).decode(errors='replace')
  try:
    holder = json.loads(text)
    return holder if isinstance(holder, dict) else {}
  except ValueError:
    return {}


class WorkdirLock:
  """Context manager holding the workdir lock of one process.

  Raises WorkdirLockedError naming the holder's pid when another live process
  holds it.
  """

  def __init__(self, workdir: str, process_index: int = 0):
    self.workdir = workdir
    self.path = lock_path(workdir, process_index)
    self._fd: int | None = None

  def acquire(self) -> None:
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_holder(fd)
      os.close(fd)
      raise WorkdirLockedError(
          f'Workdir {self.workdir} is in use by another trainer (pid '
          f'{holder.get("pid", "unknown")} on {holder.get("host", "unknown host")}, started '
          f'{holder.get("started", "at an unknown time")}); wait for it to finish, stop it, '
          'or use another --workdir.') from None
    previous = _read_holder(fd)
    if previous.get('pid') not in (None, os.getpid()):
      # We hold the flock, so its former holder is gone (killed or crashed).
      logging.warning('Took over the lock of %s left by pid %s on %s (no longer running).',
                      self.workdir, previous['pid'], previous.get('host', 'unknown host'))
    record = {'pid': os.getpid(), 'host': socket.gethostname(),
              'started': datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec='seconds')}
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(record).encode())
    self._fd = fd

  def release(self) -> None:
    if self._fd is not None:
      # Emptied, so the next trainer sees a clean release rather than a dead
      # holder; the file stays, since deleting it would let a process that opened
      # it a moment ago lock an inode nobody else sees.
      os.ftruncate(self._fd, 0)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> 'WorkdirLock':
    self.acquire()
    return self

  def __exit__(self, *exc) -> None:
    self.release()
