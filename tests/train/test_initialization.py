"""The trainer with config.initialization, optimizer.freeze and label_smoothing; export CLI."""
import re

import jax
import numpy as np
import pytest

from vmoe_sparse_ot import export
from vmoe_sparse_ot import initialization
from vmoe_sparse_ot.train import trainer
from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from tests.train.helpers import small_config


@pytest.fixture(scope='module')
def dense_workdir(tmp_path_factory):
  """A dense ViT trained 3 steps: the source of the runs below.

  On one device (its checkpoint holds whole arrays either way); the upcycled run
  below trains on all 8.
  """
  workdir = str(tmp_path_factory.mktemp('dense'))
  trainer.train_and_evaluate(small_config(train_steps=3, model__name='vit'), workdir,
                             devices=jax.devices()[:1])
  return workdir


def _flat(workdir, step=None):
  params, _ = checkpoints.restore_params(workdir, step)
  return {k: np.asarray(v) for k, v in initialization.flatten_tree(params).items()}


def test_upcycled_run_with_frozen_blocks_and_label_smoothing(dense_workdir, tmp_path, caplog):
  config = small_config(train_steps=2, label_smoothing=0.1,
                        optimizer__freeze=r'^encoder/encoderblock_0/|^embedding/')
  config.initialization.path = dense_workdir
  with caplog.at_level('INFO'):
    summary = trainer.train_and_evaluate(config, str(tmp_path))
  assert summary['step'] == 2 and np.isfinite(summary['losses']).all()
  assert 'upcycled 1 MoE layer(s) (encoder/encoderblock_1)' in caplog.text
  assert re.search(r'Initialized \d+ of \d+ parameters', caplog.text)
  source, out = _flat(dense_workdir), _flat(str(tmp_path))
  frozen = [k for k in out if k.startswith(('encoder/encoderblock_0/', 'embedding/'))]
  assert len(frozen) == 18
  for k in frozen:   # Frozen: still exactly the source's values after 2 steps.
    np.testing.assert_array_equal(out[k], source[k])
  moved = [k for k in out if k not in frozen and not np.array_equal(
      out[k], source.get(k, source.get(k.replace('moe/experts/wi_kernel', 'mlp/Dense_0/kernel'))))]
  assert 'encoder/encoderblock_1/moe/experts/wi_kernel' in moved and 'head/kernel' in moved
  # A restart ignores initialization: the checkpoint wins. (The same config, so
  # the run's programs are reused: it restores step 2 and only evaluates.)
  caplog.clear()
  with caplog.at_level('INFO'):
    again = trainer.train_and_evaluate(config, str(tmp_path))
  assert again['step'] == 2 and 'Resumed from step 2' in caplog.text
  assert 'upcycled 1 MoE layer' not in caplog.text
  assert not re.search(r'Initialized \d+ of \d+ parameters', caplog.text)
  assert again['eval'] == summary['eval']   # The trained params, not the source's.


def test_export_cli_writes_public_names_that_initialize_the_same_model(dense_workdir, tmp_path,
                                                                       capsys):
  # `python -m vmoe_sparse_ot.export` is `export.main()`; called here in-process.
  export.main([dense_workdir, str(tmp_path / 'vit.npz')])
  assert 'Wrote 40 arrays of step 3' in capsys.readouterr().out
  arrays = initialization.read_npz(str(tmp_path / 'vit.npz'))
  assert 'Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel' in arrays
  source = _flat(dense_workdir)
  fresh = {k: np.zeros_like(v) for k, v in source.items()}
  out, mapped = initialization.initialize(
      fresh, {'path': str(tmp_path / 'vit.npz'), 'raise_if_source_unmatched': True},
      num_prefix_tokens=1, log=lambda _: None)
  assert mapped.uninitialized == []
  for k, v in source.items():
    np.testing.assert_array_equal(out[k], v)


# The mistakes found before a checkpoint is read: tests/test_export.py.
@pytest.mark.parametrize('args, expected', [
    (['{tmp}/o.npz', '--step=9'], '--step=9: No checkpoint for step 9 in {dense}/checkpoints; '
     'available steps: [3]'),
    (['/proc/o.npz'], 'OUT /proc/o.npz: '),  # root may write there by its permissions
])
def test_export_cli_mistakes_are_one_line_and_write_nothing(dense_workdir, tmp_path, capsys,
                                                            args, expected):
  (tmp_path / 'file').write_text('')
  fill = lambda text: text.replace('{tmp}', str(tmp_path)).replace('{dense}', dense_workdir)
  with pytest.raises(SystemExit) as e:
    export.main([dense_workdir, *map(fill, args)])
  lines = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(lines) == 1, lines
  assert lines[0].startswith(f'{export.PROG}: error: {fill(expected)}'), lines
  assert [p.name for p in tmp_path.iterdir()] == ['file']


# The command line turns these ValueErrors into one line and exit status 2
# (tests/test_cli.py runs such errors through it).
@pytest.mark.parametrize('overrides,message', [
    # A shape mismatch: the source, a dense model, gives 64-wide MLPs into a 48-wide one.
    ({'initialization.path': '{dense}', 'model.encoder.mlp_dim': 48},
     'shape mismatch: source encoder/encoderblock_0/mlp/Dense_0/bias (64,) -> target '
     'encoder/encoderblock_0/mlp/Dense_0/bias (48,)'),
    ({'initialization.path': '{tmp}/nope'},
     'config.initialization.path: {tmp}/nope does not exist'),
    ({'initialization.path': '{tmp}/junk.bin'},
     'config.initialization.path: {tmp}/junk.bin is neither an .npz file'),
    ({'initialization.path': '{dense}', 'initialization.rules': (('zzz', ''),)},
     "config.initialization.rules[0] ('zzz') matches no source parameter"),
    ({'initialization.path': '{dense}', 'model.encoder.num_layers': 3},
     'config.initialization: 16 model parameter(s) not in the source: '
     'encoder/encoderblock_2/attention/key/bias'),
    ({'initialization.path': '{dense}', 'initialization.raise_if_source_unmatched': True,
      'model.representation_size': None, 'model.encoder.num_layers': 1},
     'config.initialization: 16 source entr(ies) unused: '),
    ({'initialization.path': '{dense}', 'initialization.step': 2},
     'config.initialization.path: No checkpoint for step 2'),
    ({'optimizer.freeze': '('}, "config.optimizer.freeze='(': must be a regular expression"),
    ({'label_smoothing': 1.0}, 'config.label_smoothing=1.0: must be in [0, 1)'),
])
def test_bad_initialization_configs_name_the_key(dense_workdir, tmp_path, overrides, message):
  (tmp_path / 'junk.bin').write_bytes(b'not weights')
  fill = lambda v: v.replace('{tmp}', str(tmp_path)).replace('{dense}', dense_workdir) \
      if isinstance(v, str) else v
  config = small_config(**{k.replace('.', '__'): fill(v) for k, v in overrides.items()})
  with pytest.raises(ValueError) as e:
    config_lib.check_before_training(config, str(tmp_path / 'w'))
  assert '\n' not in str(e.value) and fill(message) in str(e.value), str(e.value)
  assert not (tmp_path / 'w').exists()
