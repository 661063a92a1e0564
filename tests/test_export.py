"""export: a checkpoint's parameters under another naming, and the command line's checks."""
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot import export

PARAMS = {'encoder': {'encoderblock_0': {'mlp': {'Dense_0': {
    'kernel': jnp.asarray([[1.5, -2.0]], jnp.bfloat16), 'bias': np.arange(2, dtype=np.int32)}}}},
          'head': {'kernel': np.ones((2, 3), np.float32)}}


def test_exported_arrays_rename_and_widen_bfloat16_only():
  ours = export.exported_arrays(PARAMS, 'ours')
  assert sorted(ours) == ['encoder/encoderblock_0/mlp/Dense_0/bias',
                          'encoder/encoderblock_0/mlp/Dense_0/kernel', 'head/kernel']
  kernel = ours['encoder/encoderblock_0/mlp/Dense_0/kernel']
  assert kernel.dtype == np.float32                      # bfloat16: no .npz dtype.
  np.testing.assert_array_equal(kernel, [[1.5, -2.0]])   # Exact in both dtypes.
  assert ours['encoder/encoderblock_0/mlp/Dense_0/bias'].dtype == np.int32
  vit = export.exported_arrays(PARAMS)                   # The default: public ViT names.
  assert 'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel' in vit
  np.testing.assert_array_equal(vit['Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel'],
                                kernel)


@pytest.mark.parametrize('args, expected', [
    (['{tmp}'], 'OUT {tmp}: is a directory'),
    (['{tmp}/file/o.npz'], 'OUT {tmp}/file/o.npz: directory {tmp}/file does not exist'),
    (['{tmp}/o.npz', '--stepp=3'], 'unrecognized arguments: --stepp=3'),
    (['{tmp}/o.npz', '--naming=hf'], "argument --naming: invalid choice: 'hf'"),
    ([], 'the following arguments are required: out'),
])
def test_mistakes_found_before_reading_are_one_line_and_write_nothing(tmp_path, capsys, args,
                                                                      expected):
  workdir = tmp_path / 'w'
  (workdir / 'checkpoints').mkdir(parents=True)   # Checked before anything is read.
  (tmp_path / 'file').write_text('')
  fill = lambda text: text.replace('{tmp}', str(tmp_path))
  with pytest.raises(SystemExit) as e:
    export.main([str(workdir), *map(fill, args)])
  lines = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(lines) == 1, lines
  assert lines[0].startswith(f'{export.PROG}: error: {fill(expected)}'), lines
  assert sorted(p.name for p in tmp_path.iterdir()) == ['file', 'w']


def test_a_workdir_without_checkpoints_is_named(tmp_path, capsys):
  with pytest.raises(SystemExit):
    export.main([str(tmp_path), str(tmp_path / 'o.npz')])
  assert capsys.readouterr().err.strip() == (
      f'{export.PROG}: error: WORKDIR {tmp_path} has no checkpoints/ directory')
