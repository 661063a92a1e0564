r"""Train, then few-shot transfer, then plots: the quickstart in one process.

  python -m vmoe_sparse_ot.quickstart --config=configs/vmoe_tiny_mnist.py:router=sparse_ot \
      --workdir=workdirs/tiny [--config.train_steps=300 ...]

What scripts/main.sh runs. It takes every flag of `python -m vmoe_sparse_ot.main`
and trains as that command does (or resumes, or with --print_config only prints).
Then, from the checkpoint it just wrote, it runs the few-shot linear transfer of
`python -m vmoe_sparse_ot.fewshot --use_checkpoint_config` (the model is the
checkpoint's; the few-shot settings, input size and data_dir are this config's,
overrides included) and prints its table; then it writes the pictures of
`python -m vmoe_sparse_ot.plot WORKDIR` into WORKDIR/plots. One process instead
of three: Python, JAX, TensorFlow and the data load once.

A mistake in the flags or the config, the few-shot datasets included, is one
line and exit status 2 before anything trains (only the few-shot batch against
the device count is checked after it, once the devices are known). An error of
a later step is reported as that step's command reports it (the few-shot job's,
the plot command's), after the training kept its checkpoint: rerunning resumes,
so only the failed steps run again.
"""
from __future__ import annotations

from absl import app
from absl import flags

import jax

from vmoe_sparse_ot import main as train_command
from vmoe_sparse_ot import plot
from vmoe_sparse_ot import quiet_logs
from vmoe_sparse_ot.config import cli
from vmoe_sparse_ot.evaluate import checkpoint_fewshot

PROG = 'python -m vmoe_sparse_ot.quickstart'
FEWSHOT_PROG = 'python -m vmoe_sparse_ot.fewshot'


def main(argv: list[str]) -> None:
  if flags.FLAGS.print_config:
    train_command.main(argv)
    return
  quiet_logs.quiet_library_logs()  # train_command.main does too, after these checks.
  try:  # The few-shot datasets too, before training rather than after it.
    config = train_command.flag_config()
  except ValueError:
    config = None  # train_command.main names it, in one line, and exits.
  if config is not None:
    try:
      checkpoint_fewshot.check_config(config, devices=False)
    except (OSError, ValueError) as e:
      cli.fail(PROG, e)
  train_command.main(argv)  # Exits on a mistake or a failed run.
  workdir = flags.FLAGS.workdir
  print('== Few-shot linear transfer', flush=True)
  checkpoint_fewshot.run_command(FEWSHOT_PROG, config, workdir, use_checkpoint_config=True)
  if jax.process_index() == 0:
    print(f'== Plots (curves, expert load, routing, few-shot) in {workdir}/plots', flush=True)
    plot.main([workdir])


def run() -> None:
  app.run(main, flags_parser=lambda argv: cli.parse_flags(PROG, argv))


if __name__ == '__main__':
  run()
