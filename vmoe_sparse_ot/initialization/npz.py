"""`.npz` weight files: read without running code, write atomically.

A weights file is untrusted input. Entries are read from the zip archive by
their `.npy` headers, never with pickle: an object array (the only way a `.npz`
can carry code) is refused with one line, every entry must be a numeric array,
and a header cannot declare more data than the entry holds.
"""
from __future__ import annotations

import os
import zipfile
from typing import IO, Mapping

import numpy as np

from vmoe_sparse_ot import atomic
from vmoe_sparse_ot import filesystem


class WeightsFileError(ValueError):
  """A weights file that cannot be read as numeric arrays; the message is one line."""


def _check_header(path: str, name: str, dtype: np.dtype, shape: tuple, stored: int) -> None:
  if not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
    raise WeightsFileError(f'{path}: entry {name!r} has dtype {dtype}, not numeric'
                           + ('; weights files with pickled objects are refused'
                              if dtype.hasobject else ''))
  declared = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
  if declared > stored:  # Checked before numpy allocates what the header declares.
    raise WeightsFileError(f'{path}: entry {name!r} declares {declared} bytes of data '
                           f'(shape {shape}) but holds {stored}: truncated or forged')


def _entry_name(info: zipfile.ZipInfo) -> str:
  return info.filename[:-len('.npy')] if info.filename.endswith('.npy') else info.filename


def _read_entry(path: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
  name = _entry_name(info)
  with archive.open(info) as f:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
      shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    else:
      shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    _check_header(path, name, dtype, shape, info.file_size - f.tell())
    data = f.read()
  array = np.frombuffer(data, dtype=dtype, count=int(np.prod(shape, dtype=np.int64)))
  return array.reshape(shape, order='F' if fortran else 'C').copy()


def read_npz(path: str) -> dict[str, np.ndarray]:
  """{name: array} of every entry of the `.npz` at `path` (names as stored).

  Each entry's header is checked before its data is read: a numeric dtype (an
  object array is refused, never unpickled) and no more bytes declared than the
  entry holds (a forged shape cannot make us allocate). `path` may be remote
  (`gs://...`, read through `vmoe_sparse_ot.filesystem`).
  """
  if not filesystem.is_remote(path):
    return _read_archive(path, path)
  try:
    f = filesystem.open_binary(path)
  except OSError as e:
    raise WeightsFileError(f'{path}: cannot be read ({e.strerror or e})') from None
  with f:
    return _read_archive(path, f)


def _npy_magic(file: str | os.PathLike | IO[bytes]) -> bool:
  """True when `file` (a path or a seekable file object) starts as a single .npy array."""
  if isinstance(file, (str, os.PathLike)):
    with open(file, 'rb') as f:
      return f.read(6) == b'\x93NUMPY'
  file.seek(0)
  return file.read(6) == b'\x93NUMPY'


def _read_archive(path: str, file: str | IO[bytes]) -> dict[str, np.ndarray]:
  """`read_npz` of `file`, the local `path` itself or the remote file opened."""
  if not zipfile.is_zipfile(file):
    try:
      npy = _npy_magic(file)
    except OSError as e:
      raise WeightsFileError(f'{path}: cannot be read ({e.strerror or e})') from None
    raise WeightsFileError(f'{path}: ' + ('a single .npy array, not an .npz of named arrays'
                                          if npy else 'not a readable .npz file (not a zip)'))
  try:
    with zipfile.ZipFile(file) as archive:
      return {_entry_name(info): _read_entry(path, archive, info)
              for info in archive.infolist()}
  except WeightsFileError:
    raise
  except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
    text = ' '.join(str(e).split())[:200]
    raise WeightsFileError(f'{path}: not a readable .npz file ({type(e).__name__}: {text})'
                           ) from None


def write_npz(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes `arrays` to `path` (uncompressed .npz) via a temporary file renamed into place."""
  with atomic.atomic_open(path, 'wb') as f:
    np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
