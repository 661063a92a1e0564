r"""Train a V-MoE from a config file.

  python -m vmoe_sparse_ot.main --config=configs/vmoe_tiny_mnist.py:router=sparse_ot \
      --workdir=workdirs/tiny [--config.train_steps=200 ...]
  python -m vmoe_sparse_ot.main --config=configs/vmoe_b32.py --print_config

Several processes (one per host, or several on one machine for testing) each run
the same command with --num_processes/--process_id and a shared
--coordinator_address; CPU processes talk over gloo. Restarting the same command
resumes from the latest checkpoint in --workdir. When a process dies, the others
stop as soon as a collective fails (at once during training; otherwise within
`HEARTBEAT_TIMEOUT_S`, when the coordination service declares it dead) with one
line naming it and saying that relaunching all processes resumes from the last
checkpoint.

Before anything heavy (no model, no compilation) the job checks the config
(`config.validation`), then --workdir, data_dir and that the datasets exist
(`config.preflight`);
a mistake there is one line on stderr and exit status 2, as is a workdir whose
checkpoint does not fit the config (another model, data, optimizer or schedule).
"""
from __future__ import annotations

import os
import sys

from vmoe_sparse_ot import quiet_logs

quiet_logs.setup_environment()  # Before TensorFlow loads (via data).

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import errors
from vmoe_sparse_ot.config import cli
from vmoe_sparse_ot.config import reference
from vmoe_sparse_ot.evaluate import transfer

PROG = 'python -m vmoe_sparse_ot.main'
# Seconds without a heartbeat after which the coordination service declares a
# process dead and fails the others (jax's default is 100). Heartbeats come from a
# runtime thread every few seconds, also while a process compiles or evaluates.
HEARTBEAT_TIMEOUT_S = 20
# What a collective or the coordination client reports when a peer process died.
_LOST_PEER_HINTS = ('Connection reset by peer', 'Connection closed by peer', 'Broken pipe',
                    'Connection refused', 'Socket closed', 'heartbeat timeout',
                    'stopped sending heartbeats')

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file, optionally with an argument: path.py[:key=value,...].',
    lock_config=True)
# Local or remote (gs://) files, this project's or the reference code's layout.
flags.FLAGS['config'].parser = cli.ConfigFileParser('config')
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
  # Only affects the CPU backend; accelerators use their own collectives.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=coordinator_address,
                             num_processes=num_processes, process_id=process_id,
                             heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)


def lost_peer(error: BaseException) -> bool:
  """Whether `error`, raised in a multi-process run, says another process died.

  Collectives raise JaxRuntimeError; a checkpoint write that failed on one comes
  back from tensorstore as a ValueError inside a CheckpointWriteError.
  """
  seen = error
  while seen is not None:
    if any(hint in str(seen) for hint in _LOST_PEER_HINTS):
      return True
    seen = seen.__cause__ or seen.__context__
  return False


def lost_peer_message(error: BaseException, workdir: str, process_index: int,
                      process_count: int) -> str:
  """The one line a surviving process prints: who was lost, and how to resume."""
  lost = (f'process {1 - process_index}' if process_count == 2
          else f'another of the {process_count} processes')
  text = ' '.join(str(error).split()).replace('Error dispatching computation: ', '')
  directory = checkpoints.checkpoint_dir(workdir)
  steps = ([int(d) for d in os.listdir(directory) if d.isdigit()]
           if os.path.isdir(directory) else [])
  last = (f'the last checkpoint (step {max(steps)} in {directory})' if steps
          else 'the start (no checkpoint was written yet)')
  return (f'{PROG}: error: process {process_index} lost contact with {lost} ({text[:160]}); '
          f'stopping. Relaunching all {process_count} processes with the same flags resumes '
          f'from {last}.')


def _exit_lost_peer(error: BaseException, workdir: str) -> None:
  """Prints `lost_peer_message` and exits at once, with status 1.

  A normal exit would run jax.distributed's exit handler, which waits at a
  shutdown barrier for the dead process until the heartbeat timeout and then
  aborts this one with a C++ fatal log of ~40 lines; the checkpoint manager and
  the metric writers were already closed as the error propagated.
  """
  print(lost_peer_message(error, workdir, jax.process_index(), jax.process_count()),
        file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(1)  # pylint: disable=protected-access


def flag_config():
  """The config the parsed flags give: --config, its overrides, a reference config
  translated (`config.reference.resolve`; with --print_config, without needing the
  data); ValueError names what does not resolve."""
  return reference.resolve(_CONFIG.value, to_print=_PRINT_CONFIG.value)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(PROG, f'unexpected arguments {argv[1:]}')
  quiet_logs.quiet_library_logs()
  try:
    config = flag_config()
  except ValueError as e:
    cli.fail(PROG, e)
  if _PRINT_CONFIG.value:
    cli.print_stdout(cli.format_config(config))
    return
  if not _WORKDIR.value:
    cli.fail(PROG, 'flag --workdir is required (or use --print_config)')
  try:
    config_lib.check_before_training(config, _WORKDIR.value)
    initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    config_lib.validate_for_devices(config, jax.device_count(), jax.process_count())
    # Last of the checks, so a refused run leaves no empty workdir behind.
    config_lib.make_directory(_WORKDIR.value, '--workdir')
  except (OSError, ValueError) as e:
    cli.fail(PROG, e)
  # lazy: seconds of TensorFlow, optax, CLU; --help, --print_config, bad configs skip them
  from vmoe_sparse_ot.train import trainer  # pylint: disable=g-import-not-at-top
  try:
    summary = trainer.train_and_evaluate(
        config, _WORKDIR.value, allow_schedule_change=_ALLOW_SCHEDULE_CHANGE.value,
        fewshot=transfer.periodic_fewshot)
  except Exception as e:  # pylint: disable=broad-except
    # First: a failed save or read can be the symptom of a dead peer too.
    if _NUM_PROCESSES.value > 1 and lost_peer(e):
      _exit_lost_peer(e, _WORKDIR.value)
    if isinstance(e, errors.ResumeMismatchError):  # the workdir or the config is wrong
      cli.fail(PROG, e)
    if isinstance(e, (trainer.TrainerError, ValueError)):
      cli.fail(PROG, e, status=1, first_line_only=False)
    raise
  ev = summary['eval']
  if jax.process_index() == 0:
    print(f'Final {config.dataset.eval_split} accuracy at step {summary["step"]}: '
          f'{100 * ev["accuracy"]:.2f}% ({ev["num_examples"]} examples, '
          f'loss {ev["loss"]:.4f})', flush=True)
    for name, ev in summary.get('eval_datasets', {}).items():  # config.evaluate.datasets
      print(f'Final {name} accuracy at step {summary["step"]}: {100 * ev["accuracy"]:.2f}% '
            f'({ev["num_examples"]} examples, loss {ev["loss"]:.4f})', flush=True)


def run() -> None:
  app.run(main, flags_parser=lambda argv: cli.parse_flags(PROG, argv))


if __name__ == '__main__':
  run()
