"""Files written whole or not at all: a temporary file beside the target, renamed into place.

A reader (or a process killed mid-write) never sees half a file. The file gets
the permissions an ordinary `open` would give (the umask's), not mkstemp's 0600.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_open(path: str, mode: str = 'w') -> Iterator[IO]:
  """`open(path, mode)` ('w' or 'wb') whose content appears at `path` only on success."""
  if mode not in ('w', 'wb'):
    raise ValueError(f"mode={mode!r} must be 'w' or 'wb'")
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{os.path.basename(path)}.', suffix='.tmp')
  try:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    with os.fdopen(fd, mode, **({} if 'b' in mode else {'encoding': 'utf-8'})) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` atomically."""
  with atomic_open(path) as f:
    f.write(text)


def write_json(path: str, payload: Any, **dump_kwargs: Any) -> None:
  """Writes `payload` as JSON (indent 2 unless given, then a newline) to `path` atomically."""
  dump_kwargs.setdefault('indent', 2)
  with atomic_open(path) as f:
    json.dump(payload, f, **dump_kwargs)
    f.write('\n')
