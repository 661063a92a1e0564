"""Damaged checkpoints fall back and a full disk keeps the last good one, through the trainer.

(One trainer per workdir: tests/train/test_lock.py.)"""
import glob
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import errors
from vmoe_sparse_ot.train import trainer
from tests import compile_profile
from tests.train import helpers

RUN = dict(train_steps=8, checkpoint__every_steps=4, checkpoint__keep=3, log_every_steps=4)


def _config(**overrides):
  return helpers.small_config('router=topk', **dict(RUN, **overrides))


def _steps(workdir):
  return sorted(os.listdir(os.path.join(workdir, 'checkpoints')))


def _assert_equal_trees(got, want):
  flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
  assert len(flat_got) == len(jax.tree.leaves(want))
  for (path, a), b in zip(flat_got, jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A workdir with checkpoints 4 and 8, and the params of each."""
  workdir = str(tmp_path_factory.mktemp('trained'))
  trainer.train_and_evaluate(_config(), workdir, devices=jax.devices()[:1])
  assert _steps(workdir) == ['4', '8']
  return workdir, {s: checkpoints.restore_params(workdir, s)[0] for s in (4, 8)}


def _largest_file(directory):
  files = [f for f in glob.glob(os.path.join(directory, '**', '*'), recursive=True)
           if os.path.isfile(f)]
  return max(files, key=os.path.getsize)


def _empty(directory):
  for name in os.listdir(directory):
    path = os.path.join(directory, name)
    shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


DAMAGE = {
    'params_manifest_deleted': lambda d: os.remove(os.path.join(d, 'params', 'manifest.ocdbt')),
    'params_data_truncated': lambda d: os.truncate(_largest_file(os.path.join(d, 'params')), 10),
    'state_data_truncated': lambda d: os.truncate(_largest_file(os.path.join(d, 'state')), 10),
    'state_item_deleted': lambda d: shutil.rmtree(os.path.join(d, 'state')),
    'metadata_deleted': lambda d: os.remove(os.path.join(d, 'meta', 'metadata')),
    'step_folder_emptied': _empty,
}


@pytest.mark.parametrize('damage', sorted(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_to_the_previous_one(trained, tmp_path, damage,
                                                                  caplog):
  source, params = trained
  workdir = str(tmp_path / 'run')
  shutil.copytree(source, workdir)
  DAMAGE[damage](os.path.join(workdir, 'checkpoints', '8'))
  caplog.set_level(logging.WARNING)

  # The few-shot job's reader skips a step whose params or metadata are damaged
  # (it reads nothing else) and leaves it in place.
  got, step = checkpoints.restore_params(workdir)
  assert step == (8 if damage.startswith('state') else 4)
  _assert_equal_trees(got, params[step])
  assert _steps(workdir) == ['4', '8']

  # The trainer moves it aside, says so in one line, and resumes from step 4:
  # training steps 5-8 again gives the undamaged step 8 bit for bit. Its
  # programs are those the trained run compiled (train.programs: same config,
  # same device): nothing is traced or compiled again.
  caplog.clear()
  compiles = []
  with compile_profile.counting_compiles(compiles):
    summary = trainer.train_and_evaluate(_config(), workdir, devices=jax.devices()[:1])
  assert compiles == [], compiles
  moved = [r.getMessage() for r in caplog.records if 'is damaged' in r.getMessage()]
  assert len(moved) == 1 and '\n' not in moved[0], moved
  assert moved[0].startswith(f'Checkpoint step 8 in {workdir}/checkpoints is damaged (')
  assert moved[0].endswith('moved it to 8.corrupt and resumed from step 4.')
  assert summary['train_loss_history'][0][0] == 5
  assert _steps(workdir) == ['4', '8', '8.corrupt']
  got, step = checkpoints.restore_params(workdir)
  assert step == 8
  _assert_equal_trees(got, params[8])


def test_no_checkpoint_restores_fails_in_one_line_naming_the_folder(trained, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(trained[0], workdir)
  for step in ('4', '8'):
    DAMAGE['params_manifest_deleted'](os.path.join(workdir, 'checkpoints', step))
  folder = os.path.join(workdir, 'checkpoints')
  for call in (lambda: trainer.train_and_evaluate(_config(), workdir, devices=jax.devices()[:1]),
               lambda: checkpoints.restore_params(workdir)):
    with pytest.raises(errors.CheckpointRestoreError,
                       match=rf'^No checkpoint in {folder} restores: step\(s\) \[8, 4\] are '
                             r'damaged \(step 8: ValueError: NOT_FOUND') as e:
      call()
    assert '\n' not in str(e.value)
  assert _steps(workdir) == ['4', '8']  # Nothing renamed when nothing restores.


def test_explicit_damaged_step_is_named(trained, tmp_path):
  workdir = str(tmp_path / 'run')
  shutil.copytree(trained[0], workdir)
  DAMAGE['state_item_deleted'](os.path.join(workdir, 'checkpoints', '8'))
  _assert_equal_trees(checkpoints.restore_params(workdir, 8)[0], trained[1][8])  # Params intact.
  DAMAGE['params_manifest_deleted'](os.path.join(workdir, 'checkpoints', '8'))
  with pytest.raises(errors.CheckpointRestoreError, match='^Checkpoint step 8 in .* does not '
                     r'restore \(ValueError: NOT_FOUND'):
    checkpoints.restore_params(workdir, 8)


FULL_DISK = textwrap.dedent('''
    import resource, signal, sys
    import jax
    from tests.train.helpers import small_config
    from vmoe_sparse_ot.train import trainer
    from vmoe_sparse_ot import checkpoints
    from vmoe_sparse_ot import errors

    save = checkpoints.Checkpointer.save

    def save_on_a_full_disk(self, step, state, meta):
      if step == 8:  # From here on no file may grow past 60 kB (the params are ~120 kB).
        self.wait()  # Step 4's save completes first.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, resource.RLIM_INFINITY))
      return save(self, step, state, meta)

    checkpoints.Checkpointer.save = save_on_a_full_disk
    config = small_config('router=topk', train_steps=12, checkpoint__every_steps=4,
                          checkpoint__keep=1, log_every_steps=4)
    try:
      trainer.train_and_evaluate(config, sys.argv[1], devices=jax.devices()[:1])
    except errors.CheckpointWriteError as e:
      print(e)
      sys.exit(3)
''')


def test_full_disk_is_one_line_keeps_the_last_good_checkpoint_and_is_cleaned_up(tmp_path,
                                                                                caplog):
  workdir = str(tmp_path)
  result = subprocess.run([sys.executable, '-c', FULL_DISK, workdir], cwd=helpers.ROOT,
                          env=helpers.env(), capture_output=True, text=True, timeout=240)
  assert result.returncode == 3, result.stderr[-3000:]
  lines = result.stdout.strip().splitlines()
  assert len(lines) == 1, result.stdout
  assert lines[0].startswith(f'Writing checkpoint step 8 to {workdir}/checkpoints failed: the '
                             'disk is full or a file-size limit was reached (')
  assert lines[0].endswith('The last good checkpoint is step 4; its partial folder is '
                           'removed at the next start.')
  assert 'Traceback' not in result.stderr, result.stderr[-3000:]
  leftover = glob.glob(os.path.join(workdir, 'checkpoints', '*.orbax-checkpoint-tmp*'))
  assert leftover and _steps(workdir) == sorted(['4', *map(os.path.basename, leftover)])
  # The next start removes the partial save; step 4 (keep=1) survived and restores.
  caplog.set_level(logging.WARNING)
  checkpoints.Checkpointer(workdir, keep=1).close()
  assert any('Removed 1 unfinished checkpoint folder' in r.getMessage() for r in caplog.records)
  assert _steps(workdir) == ['4']
  params, step = checkpoints.restore_params(workdir)
  assert step == 4 and all(np.isfinite(x).all() for x in jax.tree.leaves(params))
