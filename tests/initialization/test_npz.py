"""`.npz` weights are untrusted: no pickle, numeric arrays only, one-line errors."""
import os
import pickle
import zipfile

import numpy as np
import pytest

from vmoe_sparse_ot.initialization.npz import WeightsFileError, read_npz, write_npz


class _Boom:
  """Unpickling this creates a file: the proof that code ran."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (open, (self.path, 'w'))


def _one_line(error):
  assert '\n' not in str(error.value)
  return str(error.value)


def test_round_trip_and_atomic_write(tmp_path):
  arrays = {'a/b': np.arange(6, dtype=np.float32).reshape(2, 3), 'c': np.int32(3)}
  write_npz(str(tmp_path / 'w.npz'), arrays)
  assert sorted(os.listdir(tmp_path)) == ['w.npz']          # No temporary file left.
  back = read_npz(str(tmp_path / 'w.npz'))
  assert back.keys() == arrays.keys()
  for k, v in arrays.items():
    np.testing.assert_array_equal(back[k], v)
    assert back[k].dtype == np.asarray(v).dtype


def test_object_array_is_refused_without_running_code(tmp_path):
  marker = tmp_path / 'pwned'
  payload = np.empty((1,), dtype=object)
  payload[0] = _Boom(str(marker))
  np.savez(tmp_path / 'evil.npz', kernel=np.zeros(3), evil=payload)
  with pytest.raises(WeightsFileError) as e:
    read_npz(str(tmp_path / 'evil.npz'))
  assert "entry 'evil' has dtype object, not numeric; weights files with pickled" in _one_line(e)
  assert not marker.exists()


def test_a_pickle_renamed_npz_is_refused(tmp_path):
  marker = tmp_path / 'pwned'
  (tmp_path / 'evil.npz').write_bytes(pickle.dumps(_Boom(str(marker))))
  with pytest.raises(WeightsFileError) as e:
    read_npz(str(tmp_path / 'evil.npz'))
  assert 'not a readable .npz file' in _one_line(e)
  assert not marker.exists()


def test_strings_truncation_and_single_arrays_are_refused(tmp_path):
  np.savez(tmp_path / 's.npz', names=np.array(['a', 'b']))
  with pytest.raises(WeightsFileError) as e:
    read_npz(str(tmp_path / 's.npz'))
  assert "entry 'names' has dtype <U1, not numeric" in _one_line(e)

  np.savez(tmp_path / 'big.npz', kernel=np.zeros((256, 256), np.float32))
  data = (tmp_path / 'big.npz').read_bytes()
  (tmp_path / 'cut.npz').write_bytes(data[:len(data) // 2])
  with pytest.raises(WeightsFileError) as e:
    read_npz(str(tmp_path / 'cut.npz'))
  assert 'cut.npz: not a readable .npz file' in _one_line(e)

  np.save(tmp_path / 'one.npy', np.zeros(3))
  with pytest.raises(WeightsFileError) as e:
    read_npz(str(tmp_path / 'one.npy'))
  assert 'single .npy array' in _one_line(e)


def test_a_zip_bomb_sized_header_is_refused_before_allocating(tmp_path):
  # An .npy header that declares a huge array over a few bytes of data.
  header = ("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }"
            .ljust(118) + '\n')
  npy = b'\x93NUMPY\x01\x00' + len(header).to_bytes(2, 'little') + header.encode() + b'\0' * 16
  with zipfile.ZipFile(tmp_path / 'bomb.npz', 'w') as z:
    z.writestr('kernel.npy', npy)
  with pytest.raises(WeightsFileError) as e:
    read_npz(str(tmp_path / 'bomb.npz'))
  assert 'bomb.npz' in _one_line(e)
