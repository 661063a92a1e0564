"""`.npz` weight files: read without running code, write atomically.

A weights file is untrusted input. Entries are read from the zip archive by
their `.npy` headers, never with pickle: an object array (the only way a `.npz`
can carry code) is refused with one line, every entry must be a numeric array,
and a header cannot declare more data than the entry holds.
"""
from __future__ import annotations

import zipfile
from typing import Mapping

import numpy as np

from vmoe_sparse_ot import atomic


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
  entry holds (a forged shape cannot make us allocate).
  """
  if not zipfile.is_zipfile(path):
    try:
      with open(path, 'rb') as f:
        npy = f.read(6) == b'\x93NUMPY'
    except OSError as e:
      raise WeightsFileError(f'{path}: cannot be read ({e.strerror})') from None
    raise WeightsFileError(f'{path}: ' + ('a single .npy array, not an .npz of named arrays'
                                          if npy else 'not a readable .npz file (not a zip)'))
  try:
    with zipfile.ZipFile(path) as archive:
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
