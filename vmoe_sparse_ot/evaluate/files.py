"""Result files the evaluation jobs write: JSON, atomically (no half-written file is ever seen)."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_json_atomic(path: str, payload: Any) -> None:
  """Writes `payload` as JSON to `path` via a temporary file renamed into place."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  stem = os.path.splitext(os.path.basename(path))[0]
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f'.{stem}.', suffix='.json.tmp')
  try:
    # mkstemp makes the file private (0600); results are as readable as any file.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    with os.fdopen(fd, 'w') as f:
      json.dump(payload, f, indent=2)
      f.write('\n')
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
