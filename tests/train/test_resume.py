"""SIGKILL of the training command after a checkpoint, restart, same final params.

(The command's one-line errors: tests/test_cli.py.)"""
import json
import logging
import os
import re
import signal
import subprocess
import time

import jax
import numpy as np

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot.train import trainer
from tests.train import helpers

# Killed right after its first checkpoint (step 4), the run has 12 steps left: room
# enough that the kill lands well before the end.
STEPS = 16
OVERRIDES = dict(train_steps=STEPS, checkpoint__every_steps=4, log_every_steps=4,
                 eval_every_steps=0)


def _finished_steps(workdir):
  directory = os.path.join(workdir, 'checkpoints')
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def test_kill_and_resume_matches_uninterrupted_run(tmp_path, caplog):
  killed = str(tmp_path / 'killed')
  cmd = helpers.main_command(*helpers.cli_args(killed, 'router=topk', **OVERRIDES))
  proc = subprocess.Popen(cmd, env=helpers.env(num_devices=1), cwd=helpers.ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 180
    while not _finished_steps(killed) and proc.poll() is None and time.time() < deadline:
      time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == -signal.SIGKILL, err[-3000:]
  steps_at_kill = _finished_steps(killed)
  assert steps_at_kill and steps_at_kill[-1] < STEPS, steps_at_kill

  # The restart, in this process: the trainer the command runs, resuming the
  # killed command's workdir; it and the uninterrupted reference below share
  # their compiled programs. (Relaunching the command itself, and its console:
  # test_multiprocess.py and tests/test_cli.py.)
  config = helpers.small_config('router=topk', **OVERRIDES)
  with caplog.at_level(logging.INFO):
    summary = trainer.train_and_evaluate(config, killed, devices=jax.devices()[:1])
  logged = [r.getMessage() for r in caplog.records]
  assert f'Resumed from step {steps_at_kill[-1]}' in caplog.text
  assert summary['step'] == STEPS and summary['eval']['num_examples'] == 300
  # One progress line per interval (means, steps/s, ETA), the first right after
  # compilation (its program may be an earlier test's in this worker: same config).
  first = steps_at_kill[-1] + 1
  assert [m for m in logged if re.fullmatch(
      rf'step {first}/{STEPS}: (compiled and ran in \d+\.\ds|ran in \d+\.\ds \(already '
      rf'compiled\)); loss \d\.\d{{4}}, .*', m)]
  progress = [re.fullmatch(rf'step (\d+)/{STEPS}: mean of steps (\d+)-(\d+): loss \d\.\d{{4}}, '
                           r'accuracy \d\.\d{3}; lr \S+; \S+ steps/s, \d+ images/s; ETA \dm\d\ds',
                           m) for m in logged]
  want = [s for s in range(first + 1, STEPS + 1) if s % 4 == 0 or s == STEPS]
  assert [int(p[1]) for p in progress if p] == want, logged
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(killed))
  # metrics.jsonl: the killed run's records after its last checkpoint were
  # dropped on resume, so each step is logged once.
  with open(os.path.join(killed, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  train_steps = [r['step'] for r in records if r['split'] == 'train']
  assert train_steps == sorted(set(train_steps)) and train_steps[-1] == STEPS
  assert [r['step'] for r in records if r['split'] == 'eval'] == [STEPS]

  reference = str(tmp_path / 'reference')
  caplog.clear()
  with caplog.at_level(logging.INFO):
    trainer.train_and_evaluate(config, reference, devices=jax.devices()[:1])
  # Its train step is the restart's (train.programs), and its first line says so.
  assert [r for r in caplog.records if re.fullmatch(
      rf'step 1/{STEPS}: ran in \d+\.\ds \(already compiled\); loss \d\.\d{{4}}, .*',
      r.getMessage())]
  got, got_step = checkpoints.restore_params(killed)
  want, want_step = checkpoints.restore_params(reference)
  assert got_step == want_step == STEPS
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))


def test_keep_steps_multiple_of_keeps_those_steps_beside_the_last_ones(tmp_path):
  """checkpoint.keep_steps_multiple_of=2, keep=1, saves every step: the multiples of 2
  stay forever beside the newest step (and the newest verified-good one, the step
  before it), and a resumed run goes on from the newest."""
  def saved():
    return sorted(int(d) for d in os.listdir(tmp_path / 'checkpoints') if d.isdigit())

  run = dict(checkpoint__every_steps=1, checkpoint__keep=1,
             checkpoint__keep_steps_multiple_of=2)
  trainer.train_and_evaluate(helpers.small_config(train_steps=5, **run), str(tmp_path),
                             devices=jax.devices()[:1])
  # 5: the newest (keep=1); 4: the newest verified one (step 5's loss was finite);
  # 2 and 4: multiples of 2. Without the option: [4, 5].
  assert saved() == [2, 4, 5]
  summary = trainer.train_and_evaluate(helpers.small_config(train_steps=7, **run),
                                       str(tmp_path), devices=jax.devices()[:1],
                                       allow_schedule_change=True)
  assert summary['step'] == 7 and len(summary['losses']) == 2   # steps 6 and 7 only
  assert saved() == [2, 4, 6, 7]
