"""Two processes on 127.0.0.1 (gloo CPU collectives) match one process, same global batch."""
import json
import logging
import os
import re
import socket
import subprocess

import jax
import numpy as np

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot.train import trainer
from tests.train import helpers

OVERRIDES = helpers.SIX_STEPS  # Those of the shared one-process run, topk_six_steps.


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _run_two_processes(flags):
  address = f'127.0.0.1:{_free_port()}'
  procs = [subprocess.Popen(
      helpers.main_command(*flags, f'--coordinator_address={address}', '--num_processes=2',
                           f'--process_id={i}'),
      env=helpers.env(num_devices=1), cwd=helpers.ROOT, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True) for i in range(2)]
  try:
    outs = [p.communicate(timeout=240) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-3000:]
  return outs


def test_two_processes_match_one_process(tmp_path, topk_six_steps, caplog):
  workdir = str(tmp_path / 'two')
  # One device per process and experts split over the two processes: the MoE
  # all-to-alls cross the process boundary. Seed 1: see the one-process run below.
  flags = helpers.cli_args(workdir, 'router=topk', mesh__expert=2, seed=1, **OVERRIDES)
  outs = _run_two_processes(flags)
  assert "mesh {'data': 1, 'expert': 2}; 2 process(es)" in outs[0][1]
  # Each process holds its own workdir lock; only process 0 prints progress.
  assert sorted(f for f in os.listdir(workdir) if f.startswith('.lock')) == [
      '.lock', '.lock.process-1']
  assert 'step 6/6: mean of step' in outs[0][1] and 'step 6/6:' not in outs[1][1]
  assert 'step 1/6: compiled and ran in' in outs[0][1]
  assert 'compiled and ran in' not in outs[1][1]
  with open(os.path.join(workdir, 'summary.json')) as f:
    two = json.load(f)

  # One process, one device, the same global batch (test_routers.py shows the
  # device count does not change the loss). Its train step is the shared seed-0
  # run's (topk_six_steps; train.programs: the seed only chooses the initial
  # state), so this also checks that a kept step trains another seed as a fresh
  # process does.
  one_workdir = str(tmp_path / 'one')
  with caplog.at_level(logging.INFO):
    one = trainer.train_and_evaluate(helpers.small_config('router=topk', seed=1, **OVERRIDES),
                                     one_workdir, devices=jax.devices()[:1])
  assert [r for r in caplog.records if re.fullmatch(
      r'step 1/6: ran in \d+\.\ds \(already compiled\); .*', r.getMessage())]
  assert one['final_train_loss'] != topk_six_steps[1]['final_train_loss']
  np.testing.assert_allclose(two['final_train_loss'], one['final_train_loss'], rtol=1e-5)
  assert two['eval']['num_examples'] == one['eval']['num_examples'] == 300
  np.testing.assert_allclose(two['eval']['loss'], one['eval']['loss'], rtol=1e-5)
  got, _ = checkpoints.restore_params(workdir)
  want, _ = checkpoints.restore_params(one_workdir)
  # Adam divides by the gradient's RMS, so a parameter whose gradient is ~0 (an
  # expert bias at init, 1e-6) can move by up to the step size in either direction
  # on a 1e-9 difference in summation order: compare at the learning-rate scale.
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)

  # Relaunched, both processes agree on the checkpoint to restore (a collective
  # check) and, with nothing left to train, only evaluate.
  outs = _run_two_processes(flags)
  for _, err in outs:
    assert 'Resumed from step 6 of' in err
  assert 'Final test[:300] accuracy at step 6' in outs[0][0]
