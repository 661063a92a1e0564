r"""Train a V-MoE from a config file.

  python -m vmoe_sparse_ot.main --config=configs/vmoe_tiny_mnist.py:router=sparse_ot \
      --workdir=workdirs/tiny [--config.train_steps=200 ...]

Several processes (one per host, or several on one machine for testing) each run
the same command with --num_processes/--process_id and a shared
--coordinator_address; CPU processes talk over gloo. Restarting the same command
resumes from the latest checkpoint in --workdir.
"""
from __future__ import annotations

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # Before TensorFlow loads (via data).

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from vmoe_sparse_ot import quiet_logs
from vmoe_sparse_ot.train import config as config_lib

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file, optionally with an argument: path.py[:key=value,...].',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', os.environ.get('JAX_COORDINATOR_ADDRESS'),
    'host:port of process 0, for multi-process runs (e.g. 127.0.0.1:12345).')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', int(os.environ.get('JAX_NUM_PROCESSES', '1')), 'Number of processes.')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', int(os.environ.get('JAX_PROCESS_ID', '0')), 'Index of this process.')
flags.mark_flags_as_required(['config', 'workdir'])


def _parse_flags(argv: list[str]) -> list[str]:
  """absl parsing, but a typo in a --config.* override names the valid keys."""
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError, ValueError, flags.Error) as e:
    config_spec = next((a.split('=', 1)[1] for a in argv if a.startswith('--config=')), None)
    overrides = [a for a in argv if a.startswith('--config.')]
    message = None
    if config_spec and overrides:
      try:
        message = config_lib.explain_override(config_lib.load_config_file(config_spec),
                                              overrides)
      except Exception:  # pylint: disable=broad-except
        message = None
    if message is None:
      # config_flags embeds the config file's traceback; its last line is the cause.
      lines = [line for line in str(e).splitlines() if line.strip()]
      message = lines[-1] if lines else repr(e)
    print(f'Error: {message}', file=sys.stderr)
    sys.exit(2)


def initialize_distributed(coordinator_address: str | None, num_processes: int,
                           process_id: int) -> None:
  """`jax.distributed.initialize` for multi-process runs (gloo collectives on CPU)."""
  if num_processes <= 1:
    return
  import jax  # pylint: disable=g-import-not-at-top
  if not coordinator_address:
    raise ValueError('--coordinator_address is required when --num_processes > 1')
  # Only affects the CPU backend; accelerators use their own collectives.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  quiet_logs.quiet_library_logs()
  config = _CONFIG.value
  try:
    config_lib.validate(config)  # A config file that failed to load raises OSError here.
    from vmoe_sparse_ot import nn  # pylint: disable=g-import-not-at-top
    nn.build_model(config.model)  # Validates model and router options before any work.
  except (OSError, ValueError) as e:
    print(f'Error: invalid config: {e}', file=sys.stderr)
    sys.exit(2)
  initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  from vmoe_sparse_ot.train import trainer  # pylint: disable=g-import-not-at-top
  try:
    summary = trainer.train_and_evaluate(config, _WORKDIR.value)
  except (trainer.NonFiniteLossError, ValueError) as e:
    logging.error('%s', e)
    print(f'Error: {e}', file=sys.stderr)
    sys.exit(1)
  ev = summary['eval']
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() == 0:
    print(f'Final {config.dataset.eval_split} accuracy at step {summary["step"]}: '
          f'{100 * ev["accuracy"]:.2f}% ({ev["num_examples"]} examples, '
          f'loss {ev["loss"]:.4f})', flush=True)


def run() -> None:
  app.run(main, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
