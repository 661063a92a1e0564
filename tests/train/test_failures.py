"""Failures a user must act on: a diverged run names a checkpoint that really is good."""
import os
import re
import shutil

import jax
import numpy as np
import pytest

from vmoe_sparse_ot.train import errors
from vmoe_sparse_ot.train import trainer
from tests.train import helpers

# Adam at a peak learning rate of 1e6 (warmup over 5 steps): the parameters stay
# finite for a few steps but grow so large that the next loss is NaN.
DIVERGING = dict(schedule__peak_value=1e6, train_steps=8, checkpoint__every_steps=1,
                 checkpoint__keep=1)


def _saved(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())


def test_divergence_names_the_newest_checkpoint_whose_next_loss_was_finite(tmp_path):
  workdir = str(tmp_path / 'run')
  config = helpers.small_config('router=topk', **DIVERGING)
  with pytest.raises(errors.NonFiniteLossError) as e:
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  message = str(e.value)
  assert '\n' not in message
  match = re.match(r'Non-finite training loss or gradient at step (\d+); stopping\. The last '
                   r'good checkpoint is step (\d+) in (\S+) \(', message)
  assert match, message
  bad, good = int(match[1]), int(match[2])
  assert match[3] == os.path.join(workdir, 'checkpoints')
  # Step bad - 1 was saved (finite) but its parameters gave the NaN loss: the good
  # one is bad - 2, and keep=1 rotation did not delete it.
  assert good == bad - 2 >= 1
  assert _saved(workdir) == [good, bad - 1]
  assert message.endswith(f'move the later step(s) {bad - 1} out of that folder and relaunch '
                          'with a lower learning rate (config.schedule.peak_value, and '
                          '--allow_schedule_change): the same one diverges again.')

  # Doing what it says: the relaunch resumes from the named step and trains on.
  shutil.move(os.path.join(workdir, 'checkpoints', str(bad - 1)), str(tmp_path / 'diverged'))
  sane = helpers.small_config('router=topk', **dict(DIVERGING, schedule__peak_value=3e-3,
                                                     train_steps=good + 2))
  summary = trainer.train_and_evaluate(sane, workdir, devices=jax.devices()[:1],
                                       allow_schedule_change=True)
  assert summary['step'] == good + 2
  assert summary['train_loss_history'][0][0] == good + 1  # Resumed from the named step.
  assert len(summary['losses']) == 2 and np.isfinite(summary['losses']).all()
