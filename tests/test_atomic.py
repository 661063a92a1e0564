"""atomic: files written whole or not at all."""
import os
import stat

import pytest

from vmoe_sparse_ot import atomic


def test_write_json_and_text_create_folders_and_replace_files(tmp_path):
  path = tmp_path / 'new' / 'dir' / 'x.json'
  atomic.write_json(str(path), {'b': [1, 2], 'a': None})
  assert path.read_text() == '{\n  "b": [\n    1,\n    2\n  ],\n  "a": null\n}\n'
  atomic.write_json(str(path), {'a': 1}, indent=None, sort_keys=True)
  assert path.read_text() == '{"a": 1}\n'
  atomic.write_text(str(path), 'plain ü')
  assert path.read_text(encoding='utf-8') == 'plain ü'
  assert os.listdir(path.parent) == ['x.json']  # no temporary file left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
  path = tmp_path / 'x.txt'
  path.write_text('old')
  with pytest.raises(RuntimeError, match='midway'):
    with atomic.atomic_open(str(path)) as f:
      f.write('new, half')
      raise RuntimeError('midway')
  assert path.read_text() == 'old' and os.listdir(tmp_path) == ['x.txt']
  with pytest.raises(TypeError):  # not serializable: the file is not touched either
    atomic.write_json(str(path), {'a': object()})
  assert path.read_text() == 'old' and os.listdir(tmp_path) == ['x.txt']


def test_binary_mode_umask_permissions_and_bad_mode(tmp_path):
  old = os.umask(0o027)
  try:
    with atomic.atomic_open(str(tmp_path / 'x.bin'), 'wb') as f:
      f.write(b'\x00\x01')
  finally:
    os.umask(old)
  assert (tmp_path / 'x.bin').read_bytes() == b'\x00\x01'
  assert stat.S_IMODE(os.stat(tmp_path / 'x.bin').st_mode) == 0o640  # 0o666 & ~0o027
  with pytest.raises(ValueError, match="mode='a' must be 'w' or 'wb'"):
    with atomic.atomic_open(str(tmp_path / 'y'), 'a'):
      pass
  assert not (tmp_path / 'y').exists()
