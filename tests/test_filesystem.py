"""`vmoe_sparse_ot.filesystem`: a remote path (an in-memory file system registered with
etils.epath in tests/memory_fs.py) reads as the same file on local disk does."""
import os

import numpy as np
import pytest

from tests import memory_fs
from vmoe_sparse_ot import filesystem
from vmoe_sparse_ot.config import load_config_file
from vmoe_sparse_ot.initialization import npz


@pytest.fixture
def both(tmp_path):
  """(local folder, remote folder) holding the same file `f.bin` and an empty folder `sub`."""
  memory_fs.reset()
  data = bytes(range(256)) * 3
  (tmp_path / 'f.bin').write_bytes(data)
  (tmp_path / 'sub').mkdir()
  memory_fs.put('memtest://bucket/run/f.bin', data)
  memory_fs.put('memtest://bucket/run/sub/x', b'')
  yield str(tmp_path), 'memtest://bucket/run'
  memory_fs.reset()


def test_local_and_remote_agree(both):
  for root in both:
    f = f'{root}/f.bin'
    assert filesystem.is_remote(f) == root.startswith('memtest://')
    assert (filesystem.exists(f), filesystem.isfile(f), filesystem.isdir(f)) == (True, True, False)
    assert (filesystem.isfile(f'{root}/sub'), filesystem.isdir(f'{root}/sub')) == (False, True)
    assert not filesystem.exists(f'{root}/nope')
    st = filesystem.stat(f)
    assert (st.is_regular, st.is_dir, st.size) == (True, False, 768)
    assert not filesystem.stat(f'{root}/sub').is_regular
    with filesystem.open_binary(f) as fh:
      fh.seek(256)
      assert fh.read(3) == bytes([0, 1, 2])
    with pytest.raises(FileNotFoundError):
      filesystem.stat(f'{root}/nope')
    with pytest.raises(FileNotFoundError):
      filesystem.open_binary(f'{root}/nope')


def test_unknown_scheme_is_one_line():
  with pytest.raises(FileNotFoundError, match=r'^nosuch://a/b: no file system is registered '
                     r'for nosuch://'):
    filesystem.exists('nosuch://a/b')


def test_npz_and_config_file_read_remote(tmp_path):
  memory_fs.reset()
  arrays = {'a/kernel': np.arange(6, dtype=np.float32).reshape(2, 3), 'b': np.int32(7)}
  npz.write_npz(str(tmp_path / 'w.npz'), arrays)
  memory_fs.put_file('memtest://b/w.npz', str(tmp_path / 'w.npz'))
  got = npz.read_npz('memtest://b/w.npz')
  assert sorted(got) == sorted(arrays)
  for k, v in arrays.items():
    np.testing.assert_array_equal(got[k], v)
  memory_fs.put('memtest://b/one.npy', b'\x93NUMPY' + b'\0' * 10)
  with pytest.raises(npz.WeightsFileError, match='a single .npy array'):
    npz.read_npz('memtest://b/one.npy')

  config = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'configs',
                        'vmoe_tiny_mnist.py')
  memory_fs.put_file('memtest://b/cfg/tiny.py', config)
  remote = load_config_file('memtest://b/cfg/tiny.py:router=sbase')
  assert remote.to_dict() == load_config_file(f'{config}:router=sbase').to_dict()
  with pytest.raises(FileNotFoundError, match="config file 'memtest://b/cfg/nope.py' not found"):
    load_config_file('memtest://b/cfg/nope.py')
  assert memory_fs.listing('memtest://b') == ['cfg', 'one.npy', 'w.npz']   # Nothing written.
  memory_fs.reset()
