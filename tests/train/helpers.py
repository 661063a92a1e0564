"""Shared helpers for trainer tests: a shrunken tiny config and subprocess commands."""
import os
import pathlib
import subprocess
import sys

from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import experiments
from tests.xla_flags import xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = str(ROOT / 'configs' / 'vmoe_tiny_mnist.py')

# Overrides that shrink the tiny MNIST config so a step takes milliseconds: the
# experiments' quick model and data (experiments.QUICK_MODEL), and the tests' own
# evaluation, schedule and cadences.
SMALL = {
    **experiments.QUICK_MODEL,
    'model.patch_size': (7, 7),
    'dataset.eval_split': 'test[:300]',
    'eval_batch_size': 64,
    'schedule.warmup_steps': 5,
    # Fixed, so the schedule (and the compiled step) does not depend on
    # train_steps: runs of different lengths compare step for step.
    'schedule.decay_steps': 100,
    'log_every_steps': 5,
    'eval_every_steps': 0,
    'checkpoint.every_steps': 1000,
}


# The shared reference run (tests/train/conftest.py: topk_six_steps): 6 steps, the
# last one checkpointed.
SIX_STEPS = {'train_steps': 6, 'checkpoint__every_steps': 6}


def _values(overrides):
  """SMALL updated with `overrides`, whose 'a.b' keys are written a__b."""
  return {**SMALL, **{k.replace('__', '.'): v for k, v in overrides.items()}}


def small_config(arg='router=topk', **overrides):
  """The tiny config with SMALL and `overrides` applied."""
  config = config_lib.load_config_file(f'{TINY}:{arg}')
  config.update_from_flattened_dict(_values(overrides))
  return config


def cli_args(workdir, arg='router=topk', **overrides):
  """Command-line flags equivalent to `small_config(arg, **overrides)`."""
  flags = [f'--config={TINY}:{arg}', f'--workdir={workdir}']
  for key, value in _values(overrides).items():
    if isinstance(value, tuple):
      value = '(' + ','.join(str(v) for v in value) + ')'
    flags.append(f'--config.{key}={value}')
  return flags


def main_command(*flags):
  return [sys.executable, '-m', 'vmoe_sparse_ot.main', *flags]


def env(num_devices=None):
  e = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  if num_devices is not None:
    e['XLA_FLAGS'] = xla_flags(num_devices)
  return e


def run(cmd, num_devices=None, timeout=240):
  return subprocess.run(cmd, env=env(num_devices), capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT)


def unlocked_config(**overrides):
  """The tiny config with SMALL, unlocked and updated with dotted-key `overrides`, which
  may add keys (a named evaluation dataset, say)."""
  config = small_config()
  config.unlock()
  config.update_from_flattened_dict(overrides)
  return config


# The tiny MNIST config's pp string, and the same with one-hot 'labels' for
# sigmoid_xent and mixup.
PP = 'decode(channels=1)|value_range(-1, 1)'
ONEHOT = f"{PP}|onehot(10, key='label', key_result='labels')"
