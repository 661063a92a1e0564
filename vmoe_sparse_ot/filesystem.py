"""Reading files that may live on a remote file system (`gs://` and other `scheme://` paths).

A path holding '://' is remote and is read through `etils.epath`, the file layer
the stack already has: `gs://` goes to `tf.io.gfile` when TensorFlow is installed
(it is here), and any scheme registered with `epath.register_path_cls` is
reached the same way (the tests register an in-memory one). Every other path is
local and goes through `os` and `open`, exactly as the callers did before.

Read-only: nothing here writes. A remote back end's own exceptions (TensorFlow's
`NotFoundError` is not an OSError) come out as OSError subclasses with one line
naming the path, so callers catch OSError for both kinds of path.
"""
from __future__ import annotations

import dataclasses
import os
import stat as stat_lib
from typing import IO, Any, Callable


@dataclasses.dataclass(frozen=True)
class Stat:
  """is_regular: a plain file (not a directory, FIFO or device); size in bytes;
  mtime_ns: modification time (a remote file system may only know whole seconds)."""
  is_regular: bool
  is_dir: bool
  size: int
  mtime_ns: int


def is_remote(path: Any) -> bool:
  """True for 'scheme://...' paths (gs://, s3://, or a scheme epath has registered)."""
  return '://' in os.fspath(path)


def _epath(path: str):
  from etils import epath  # pylint: disable=g-import-not-at-top  (only for remote paths)
  try:
    return epath.Path(path)
  except KeyError:
    scheme = path.split('://', 1)[0]
    raise FileNotFoundError(f'{path}: no file system is registered for {scheme}:// '
                            '(etils.epath knows gs://, s3://, az://, hf://)') from None


def _remote(path: str, what: Callable[[Any], Any]) -> Any:
  """`what(epath.Path(path))`, the back end's exceptions turned into one-line OSErrors."""
  try:
    return what(_epath(path))
  except OSError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (TensorFlow's errors are not OSErrors)
    text = ' '.join(str(e).split())[:200]
    raise OSError(f'{path}: {type(e).__name__}: {text}') from None


def exists(path: str) -> bool:
  if not is_remote(path):
    return os.path.exists(path)
  return _remote(path, lambda p: p.exists())


def isfile(path: str) -> bool:
  if not is_remote(path):
    return os.path.isfile(path)
  return _remote(path, lambda p: p.is_file())


def isdir(path: str) -> bool:
  if not is_remote(path):
    return os.path.isdir(path)
  return _remote(path, lambda p: p.is_dir())


def stat(path: str) -> Stat:
  """The file's Stat; FileNotFoundError (an OSError) when it does not exist."""
  if not is_remote(path):
    st = os.stat(path)
    return Stat(is_regular=stat_lib.S_ISREG(st.st_mode), is_dir=stat_lib.S_ISDIR(st.st_mode),
                size=st.st_size, mtime_ns=st.st_mtime_ns)
  if not exists(path):  # Back ends differ in what their stat raises for a missing file.
    raise FileNotFoundError(f'{path}: no such file')
  st = _remote(path, lambda p: p.stat())
  return Stat(is_regular=not st.is_directory, is_dir=bool(st.is_directory),
              size=int(st.length), mtime_ns=int(st.mtime or 0) * 10**9)


def open_binary(path: str) -> IO[bytes]:
  """The file opened for reading bytes (seekable), to use in a `with` block."""
  if not is_remote(path):
    return open(path, 'rb')  # pylint: disable=consider-using-with
  if not exists(path):  # Some back ends open lazily and fail at the first read.
    raise FileNotFoundError(f'{path}: no such file')
  return _remote(path, lambda p: p.open('rb'))


def read_text(path: str, encoding: str = 'utf-8') -> str:
  """The whole file as text."""
  with open_binary(path) as f:
    data = f.read()
  return data.decode(encoding)


__all__ = ['Stat', 'exists', 'is_remote', 'isdir', 'isfile', 'open_binary', 'read_text', 'stat']
