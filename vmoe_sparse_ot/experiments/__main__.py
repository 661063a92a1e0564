"""Command line: `python -m vmoe_sparse_ot.experiments NAME|all [--out DIR] [--quick] ...`.

Runs one experiment (or all, in order), prints its table and wall time, and
writes `DIR/NAME*.png` and `DIR/NAME.json`; `--resume` skips those already done
(`experiments.finished`), e.g. to finish an `all` that stopped part way. A mistake
(an unknown NAME, or none; a misspelt flag or a bad value; an --out that is a file
or cannot be created) prints one line and exits with status 2 before anything runs.
"""
import glob
import os

from vmoe_sparse_ot import quiet_logs

os.environ.setdefault('POT_BACKEND_DISABLE_TENSORFLOW', '1')  # before anything imports POT
quiet_logs.setup_environment()  # before TensorFlow loads (the router study's data)

from absl import app, flags, logging  # noqa: E402

from vmoe_sparse_ot import experiments  # noqa: E402
from vmoe_sparse_ot.config import cli  # noqa: E402
from vmoe_sparse_ot.config import preflight  # noqa: E402

PROG = 'python -m vmoe_sparse_ot.experiments'

_OUT = flags.DEFINE_string('out', experiments.DEFAULT_OUT, 'Directory for the PNG and JSON files.')
_QUICK = flags.DEFINE_bool('quick', False, 'Small version of each experiment (seconds; for tests).')
_RESUME = flags.DEFINE_bool(
    'resume', False, 'Skip an experiment whose DIR/NAME.json a run with the same --quick and '
    '--seeds already wrote (e.g. after `all` stopped part way); its table is still printed.')
_SEEDS = flags.DEFINE_integer('seeds', None, 'Number of seeds, for the experiments that repeat '
                              'over seeds (default: each experiment\'s own).', lower_bound=1)


def checked_names(argv) -> tuple[str, ...]:
  """The experiments to run, after every check (one line and status 2 on a mistake);
  creates --out, so none fails on it after minutes of work."""
  if len(argv) != 2:
    cli.fail(PROG, f"give one experiment name ({', '.join(experiments.NAMES)}) or all")
  names = experiments.NAMES if argv[1] == 'all' else (argv[1],)
  try:
    for n in names:
      experiments.load(n)
    preflight.make_directory(_OUT.value, '--out')
  except (OSError, ValueError) as e:
    cli.fail(PROG, e)
  return names


def main(argv):
  names = checked_names(argv)
  logging.set_verbosity(logging.WARNING)  # the trainer's progress lines (router study)
  quiet_logs.quiet_library_logs()  # e.g. Orbax's read-only notes when few-shot restores
  for n in names:
    payload = experiments.run_experiment(n, _OUT.value, quick=_QUICK.value, seeds=_SEEDS.value,
                                         resume=_RESUME.value)
    print(f'== {n} ==')
    print(experiments.load(n).format_table(payload))
    figures = glob.glob(os.path.join(_OUT.value, n + '*.png'))
    outputs = (os.path.join(_OUT.value, n + '.json')
               + (f" and {os.path.join(_OUT.value, n)}*.png" if figures else ''))
    if payload.get('resumed'):
      print(f"{n}: done by an earlier run ({payload['wall_time_s']:.1f} s), not run again: "
            f'{outputs}', flush=True)
    else:
      print(f"{n}: wall time {payload['wall_time_s']:.1f} s; wrote {outputs}", flush=True)


def run() -> None:
  # A misspelt flag or a bad value is one line and status 2, as in the other jobs.
  app.run(main, flags_parser=lambda argv: cli.parse_flags(PROG, argv))


if __name__ == '__main__':
  run()
