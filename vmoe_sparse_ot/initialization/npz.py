"""`.npz` weight files: read without running code, write atomically.

A weights file is untrusted input: it is read with `allow_pickle=False`, so an
object array (the only way a `.npz` can carry code) is refused with one line
instead of being unpickled, and every entry must be a numeric array.
"""
from __future__ import annotations

import os
import tempfile
import zipfile
from typing import Mapping

import numpy as np


class WeightsFileError(ValueError):
  """A weights file that cannot be read as numeric arrays; the message is one line."""


def read_npz(path: str) -> dict[str, np.ndarray]:
  """{name: array} of every entry of the `.npz` at `path` (names as stored)."""
  try:
    with np.load(path, allow_pickle=False) as f:
      if not isinstance(f, np.lib.npyio.NpzFile):
        raise WeightsFileError(f'{path}: a single .npy array, not an .npz of named arrays')
      out = {}
      for name in f.files:
        try:
          array = f[name]
        except ValueError as e:  # numpy refuses object arrays without pickle.
          raise WeightsFileError(f'{path}: entry {name!r} is not a numeric array ({e}); '
                                 'weights files with pickled objects are refused') from None
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_
                or array.dtype.name == 'bfloat16'):
          raise WeightsFileError(f'{path}: entry {name!r} has dtype {array.dtype}, not numeric')
        out[name] = array
      return out
  except WeightsFileError:
    raise
  except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
    text = ' '.join(str(e).split())[:200]
    raise WeightsFileError(f'{path}: not a readable .npz file ({type(e).__name__}: {text})'
                           ) from None


def write_npz(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes `arrays` to `path` (uncompressed .npz) via a temporary file renamed into place."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix='.tmp-', suffix='.npz', dir=directory)
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise
