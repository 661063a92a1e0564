"""initialization.sources: what a path holds, read once under this project's names."""
import os

import numpy as np
import pytest

from vmoe_sparse_ot.initialization import npz, sources
from vmoe_sparse_ot.initialization.rules import InitializationError


def test_unflatten_nests_slash_names():
  a, b, c = np.zeros(1), np.ones(2), np.arange(3)
  assert sources.unflatten({'x/y/k': a, 'x/z': b, 'w': c}) == {
      'x': {'y': {'k': a}, 'z': b}, 'w': c}
  assert sources.unflatten({}) == {}


def test_kind_of_tells_workdirs_npz_files_and_prefixes_and_names_the_key(tmp_path):
  (tmp_path / 'run' / 'checkpoints').mkdir(parents=True)
  (tmp_path / 'plain').mkdir()
  npz.write_npz(str(tmp_path / 'w.npz'), {'a': np.zeros(2)})
  (tmp_path / 'junk.bin').write_bytes(b'not a zip')
  (tmp_path / 'ckpt.index').write_bytes(b'')
  assert sources.kind_of(str(tmp_path / 'run')) == 'workdir'
  assert sources.kind_of(str(tmp_path / 'w.npz')) == 'npz'
  assert sources.kind_of(str(tmp_path / 'ckpt')) == 'partitioned'   # PREFIX.index
  for name, message in [
      ('nope', 'initialization.path: {p} does not exist'),
      ('plain', '--checkpoint: {p} is a directory without checkpoints/ (not a workdir of this '
       'project)'),
      ('junk.bin', '--checkpoint: {p} is neither an .npz file, a workdir nor a partitioned '
       'checkpoint prefix (PREFIX.index)')]:
    what = 'initialization.path' if name == 'nope' else '--checkpoint'
    with pytest.raises(InitializationError) as e:
      sources.kind_of(str(tmp_path / name), what)
    assert str(e.value) == message.format(p=tmp_path / name)


def test_read_source_renames_public_names_and_reads_a_file_once(tmp_path):
  path = str(tmp_path / 'vit.npz')
  kernel = np.arange(6, dtype=np.float32).reshape(2, 3)
  npz.write_npz(path, {'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel': kernel})
  source = sources.read_source(path)
  assert source.naming == 'vit'
  assert source.description == f'.npz file {path}, public ViT names'
  np.testing.assert_array_equal(source.arrays['encoder/encoderblock_0/mlp/Dense_0/kernel'],
                                kernel)
  assert source.raw_names == {'encoder/encoderblock_0/mlp/Dense_0/kernel':
                              'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel'}
  assert source.model_config is None
  assert sources.read_source(path) is source          # Unchanged file: not read again.
  npz.write_npz(path, {'head/kernel': kernel})         # Rewritten: read anew.
  os.utime(path, ns=(1, 1))
  again = sources.read_source(path)
  assert again is not source and again.naming == 'ours' and list(again.arrays) == ['head/kernel']
  with pytest.raises(InitializationError, match=r'^initialization.step applies to workdirs only; '
                     r'.*vit.npz is a npz source$'):
    sources.read_source(path, step=3)
