r"""Train a V-MoE from a config file.

  python -m vmoe_sparse_ot.main --config=configs/vmoe_tiny_mnist.py:router=sparse_ot \
      --workdir=workdirs/tiny [--config.train_steps=200 ...]
  python -m vmoe_sparse_ot.main --config=configs/vmoe_b32.py --print_config

Several processes (one per host, or several on one machine for testing) each run
the same command with --num_processes/--process_id and a shared
--coordinator_address; CPU processes talk over gloo. Restarting the same command
resumes from the latest checkpoint in --workdir.

Before anything heavy (no model, no compilation) the job checks the config
(`train.config_validation`), --workdir and data_dir, and that the datasets exist;
a mistake there is one line on stderr and exit status 2.
"""
from __future__ import annotations

import os

from vmoe_sparse_ot import quiet_logs

quiet_logs.setup_environment()  # Before TensorFlow loads (via data).

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from vmoe_sparse_ot.train import config as config_lib
from vmoe_sparse_ot.train import config_cli

PROG = 'python -m vmoe_sparse_ot.main'

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file, optionally with an argument: path.py[:key=value,...].',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and metrics.')
_PRINT_CONFIG = flags.DEFINE_bool(
    'print_config', False, 'Print the resolved config (after overrides) as JSON and exit.')
_ALLOW_SCHEDULE_CHANGE = flags.DEFINE_bool(
    'allow_schedule_change', False,
    'Resume even if train_steps or the learning-rate schedule differ from the checkpoint.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator_address', os.environ.get('JAX_COORDINATOR_ADDRESS'),
    'host:port of process 0, for multi-process runs (e.g. 127.0.0.1:12345).')
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', int(os.environ.get('JAX_NUM_PROCESSES', '1')), 'Number of processes.')
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', int(os.environ.get('JAX_PROCESS_ID', '0')), 'Index of this process.')
flags.mark_flags_as_required(['config'])


def initialize_distributed(coordinator_address: str | None, num_processes: int,
                           process_id: int) -> None:
  """`jax.distributed.initialize` for multi-process runs (gloo collectives on CPU)."""
  if num_processes <= 1:
    return
  if not coordinator_address:
    raise ValueError('--coordinator_address is required when --num_processes > 1')
  if not 0 <= process_id < num_processes:
    raise ValueError(f'--process_id={process_id} must be in [0, --num_processes={num_processes})')
  import jax
  # Only affects the CPU backend; accelerators use their own collectives.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    config_cli.fail(PROG, f'unexpected arguments {argv[1:]}')
  quiet_logs.quiet_library_logs()
  config = _CONFIG.value
  if _PRINT_CONFIG.value:
    config_cli.print_stdout(config_cli.format_config(config))
    return
  if not _WORKDIR.value:
    config_cli.fail(PROG, 'flag --workdir is required (or use --print_config)')
  try:
    config_lib.check_before_training(config, _WORKDIR.value)
    initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    import jax
    config_lib.validate_for_devices(config, jax.device_count(), jax.process_count())
  except (OSError, ValueError) as e:
    config_cli.fail(PROG, e)
  from vmoe_sparse_ot.train import trainer
  try:
    summary = trainer.train_and_evaluate(
        config, _WORKDIR.value, allow_schedule_change=_ALLOW_SCHEDULE_CHANGE.value)
  except (trainer.TrainerError, ValueError) as e:
    config_cli.fail(PROG, e, status=1, first_line_only=False)
  ev = summary['eval']
  import jax
  if jax.process_index() == 0:
    print(f'Final {config.dataset.eval_split} accuracy at step {summary["step"]}: '
          f'{100 * ev["accuracy"]:.2f}% ({ev["num_examples"]} examples, '
          f'loss {ev["loss"]:.4f})', flush=True)


def run() -> None:
  app.run(main, flags_parser=lambda argv: config_cli.parse_flags(PROG, argv))


if __name__ == '__main__':
  run()
