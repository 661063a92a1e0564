r"""Few-shot linear transfer of a trained checkpoint.

    python -m vmoe_sparse_ot.fewshot --config=configs/NAME.py --workdir=DIR [--step N]
        [--use_checkpoint_config]

Restores the parameters of checkpoint N (the latest by default) from
DIR/checkpoints, builds the model, evaluates every dataset of
`config.fewshot.datasets` with the protocol of `vmoe_sparse_ot.evaluate.transfer`,
prints a table and writes DIR/fewshot/results.json (atomically: a temporary file
renamed into place), which records the step, the model name and the router.
Parameters are laid out on the training mesh (`config.mesh`; expert parameters
split over 'expert') and each batch is split over all its devices.

The model is the one the checkpoint was trained with: its metadata holds the model
config. When `config.model` disagrees (another router, another size), the job
refuses and names every differing key with both values; with
--use_checkpoint_config it evaluates with the checkpoint's own model config
instead. The rest of the config (few-shot settings, input size, data_dir, mesh)
comes from --config.

A mistake (the config, a missing --config or --workdir, a checkpoint step that is
not there, a model mismatch) is one line and exit status 2, before any array is
read; a checkpoint that does not restore or a dataset that cannot be loaded ends
the job with exit status 1 and a message naming it.
"""
from vmoe_sparse_ot import quiet_logs

quiet_logs.setup_environment()  # Before TensorFlow loads (via data).

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app, flags
from ml_collections import config_flags

# The job without its flags lives in evaluate.checkpoint_fewshot; its names stay
# importable from here.
from vmoe_sparse_ot.evaluate.checkpoint_fewshot import (  # noqa: F401
    RESULTS_FILE, CheckpointMismatchError, check_checkpoint, check_config, check_params_match,
    format_table, run, run_command)
from vmoe_sparse_ot.config import cli
from vmoe_sparse_ot.config import reference

PROG = 'python -m vmoe_sparse_ot.fewshot'

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file of the training run (ml_collections).', lock_config=True)
# Local or remote (gs://) files, this project's or the reference code's layout.
flags.FLAGS['config'].parser = cli.ConfigFileParser('config')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Training workdir holding checkpoints/.')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step to evaluate (default: latest).')
_USE_CHECKPOINT_CONFIG = flags.DEFINE_bool(
    'use_checkpoint_config', False,
    "Evaluate with the checkpoint's own model config when --config's model differs "
    '(default: refuse and name the differences).')


def main(argv):
  if len(argv) > 1:
    cli.fail(PROG, f'unexpected arguments {argv[1:]}')
  quiet_logs.quiet_library_logs()
  if _CONFIG.value is None:
    cli.fail(PROG, 'flag --config is required')
  try:
    config = reference.resolve(_CONFIG.value)
  except ValueError as e:
    cli.fail(PROG, e)
  if not _WORKDIR.value:
    cli.fail(PROG, 'flag --workdir is required')
  run_command(PROG, config, _WORKDIR.value, _STEP.value,
              use_checkpoint_config=_USE_CHECKPOINT_CONFIG.value)


if __name__ == '__main__':
  app.run(main, flags_parser=lambda argv: cli.parse_flags(PROG, argv))
