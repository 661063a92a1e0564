"""Divergence, end to end: the error names a checkpoint that is good, and the relaunch it
asks for resumes from it. (A damaged checkpoint's read: tests/checkpoints/test_read.py.)"""
import os
import re

import jax
import numpy as np
import pytest

from vmoe_sparse_ot import errors
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
  # The step after the good one led to the NaN: moved aside, named, so that the
  # same command resumes from the good one.
  assert _saved(workdir) == [good]
  assert os.path.isdir(os.path.join(workdir, 'checkpoints', f'{bad - 1}.diverged'))
  assert message.endswith(f'the later step(s) {bad - 1} led to it and were moved to '
                          f'{bad - 1}.diverged, so a relaunch resumes from step {good}; '
                          'relaunch with a lower learning rate (config.schedule.peak_value, '
                          'and --allow_schedule_change): the same one diverges again.')

  # Doing what it says: the relaunch with a lower learning rate resumes from the
  # named step and trains on.
  sane = helpers.small_config('router=topk', **dict(DIVERGING, schedule__peak_value=3e-3,
                                                     train_steps=good + 2))
  summary = trainer.train_and_evaluate(sane, workdir, devices=jax.devices()[:1],
                                       allow_schedule_change=True)
  assert summary['step'] == good + 2
  assert summary['train_loss_history'][0][0] == good + 1  # Resumed from the named step.
  assert len(summary['losses']) == 2 and np.isfinite(summary['losses']).all()
