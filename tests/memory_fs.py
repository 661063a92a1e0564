"""An in-memory remote file system for the tests: `memtest://...` paths.

Registered with `etils.epath.register_path_cls` (the public way to add a scheme to
epath, the layer `vmoe_sparse_ot.filesystem` reads remote paths through) and kept
in fsspec's in-memory file system, so a test reads "remote" files with nothing on
disk. `put(path, data)` writes, `listing(folder)` lists, `reset()` empties it.
Only what a reader needs is implemented: exists, is_file, is_dir, stat, open('rb').
"""
import fsspec
from etils import epath
from etils.epath import stat_utils

SCHEME = 'memtest://'
_FS = fsspec.filesystem('memory')


def _key(path) -> str:
  """memtest://a/b -> /memtest/a/b in fsspec's memory file system (its own namespace)."""
  text = str(path)
  assert text.startswith(SCHEME), text
  return '/memtest/' + text[len(SCHEME):].strip('/')


@epath.register_path_cls(SCHEME)
class MemoryPath(epath.Path):
  """A `memtest://` path (a PurePosixPath that prints its scheme back)."""

  def __str__(self):
    text = super().__str__()   # pathlib folds 'memtest://a' to 'memtest:/a'
    return SCHEME + text[len('memtest:/'):] if text.startswith('memtest:/') else text

  def __fspath__(self):
    return str(self)

  def exists(self):
    return _FS.exists(_key(self))

  def is_file(self):
    return _FS.isfile(_key(self))

  def is_dir(self):
    return _FS.isdir(_key(self))

  def stat(self):
    info = _FS.info(_key(self))
    return stat_utils.StatResult(is_directory=info['type'] == 'directory', length=info['size'],
                                 mtime=0, owner=None, group=None, mode=None)

  def open(self, mode='r', encoding=None, errors=None, **kwargs):
    if mode != 'rb':
      raise NotImplementedError(f'{self}: the test file system is read-only from code ({mode})')
    return _FS.open(_key(self), 'rb')

  def read_bytes(self):
    with self.open('rb') as f:
      return f.read()


def put(path: str, data: bytes) -> None:
  _FS.pipe(_key(path), data)


def put_file(path: str, local: str) -> None:
  with open(local, 'rb') as f:
    put(path, f.read())


def listing(folder: str) -> list[str]:
  """Sorted file names directly in `folder` (a memtest:// path)."""
  return sorted(p.rsplit('/', 1)[-1] for p in _FS.ls(_key(folder), detail=False))


def reset() -> None:
  if _FS.exists('/memtest'):
    _FS.rm('/memtest', recursive=True)
