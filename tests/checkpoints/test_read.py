"""checkpoints.read: falling back past a damaged newest step leaves no read pending and no
noise on stderr. (Its fallback after real training: tests/train/test_reliability.py.)"""
import gc
import logging
import os
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot.train.state import TrainState
from tests.train import helpers


def _two_checkpoints_newest_damaged(workdir, num_arrays=40):
  """Steps 1 and 2 of a TrainState with `num_arrays` parameter arrays; step 2's params
  lose their manifest, so every one of its arrays fails to open."""
  params = {f'layer_{i}': {'kernel': jnp.full((8, 16), float(i))} for i in range(num_arrays)}
  state = TrainState(params=params, opt_state={'count': jnp.zeros((), jnp.int32)},
                     rng=jnp.zeros((2,), jnp.uint32), step=jnp.zeros((), jnp.int32))
  ckpt = checkpoints.Checkpointer(workdir, keep=2)
  for step in (1, 2):
    ckpt.save(step, state.replace(step=jnp.int32(step)), {'step': step})
  ckpt.close()
  os.remove(os.path.join(workdir, 'checkpoints', '2', 'params', 'manifest.ocdbt'))


READ_AND_EXIT = textwrap.dedent('''
    import sys
    from vmoe_sparse_ot import checkpoints
    for _ in range(3):
      _, meta, step = checkpoints.restore_params_with_meta(sys.argv[1])
    print(step, meta['step'])
''')


def test_falling_back_from_a_damaged_checkpoint_leaves_no_read_pending(tmp_path, monkeypatch,
                                                                       caplog):
  workdir = str(tmp_path)
  _two_checkpoints_newest_damaged(workdir)
  # Orbax stops waiting at the first failed read; reads still in flight used to
  # call back into its closed event loop ("Event loop is closed", printed with a
  # traceback when that happened at exit). The few-shot job reads like this.
  unraisable = []
  monkeypatch.setattr(sys, 'unraisablehook', unraisable.append)
  caplog.set_level(logging.WARNING, logger='asyncio')
  for _ in range(5):
    _, meta, step = checkpoints.restore_params_with_meta(workdir)
    assert step == meta['step'] == 1
  time.sleep(0.2)
  gc.collect()  # "Task was destroyed but it is pending" would be logged now.
  assert not unraisable, [str(u.exc_value) for u in unraisable[:3]]
  assert not [r for r in caplog.records if r.name == 'asyncio']

  # And a process that does so exits without a word on stderr but the fallback's.
  result = subprocess.run([sys.executable, '-c', READ_AND_EXIT, workdir], cwd=helpers.ROOT,
                          env=helpers.env(), capture_output=True, text=True, timeout=120)
  assert result.returncode == 0 and result.stdout.split() == ['1', '1'], result.stderr
  noise = [line for line in result.stderr.splitlines() if line.strip() and not any(
      known in line for known in ('is damaged (', 'read_only=True', 'directory is read only',
                                  'absl::InitializeLog'))]
  assert not noise, result.stderr[-3000:]


def test_param_shapes_names_every_leaf_with_its_shape():
  params = {'a': {'kernel': jax.ShapeDtypeStruct((2, 3), np.float32)}, 'b': np.zeros(5)}
  assert checkpoints.param_shapes(params) == {'a/kernel': [2, 3], 'b': [5]}
