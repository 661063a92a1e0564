"""Command line: `python -m vmoe_sparse_ot.experiments NAME|all [--out DIR] [--quick] ...`.

Runs one experiment (or all, in order), prints its table and wall time, and
writes `DIR/NAME*.png` and `DIR/NAME.json`; `--resume` skips those already done
(`experiments.finished`), e.g. to finish an `all` that stopped part way. An unknown
NAME, or none, prints one line and exits with status 2.
"""
import glob
import os
import sys

from vmoe_sparse_ot import quiet_logs

os.environ.setdefault('POT_BACKEND_DISABLE_TENSORFLOW', '1')  # before anything imports POT
quiet_logs.setup_environment()  # before TensorFlow loads (the router study's data)

from absl import app, flags, logging  # noqa: E402

from vmoe_sparse_ot import experiments  # noqa: E402

_OUT = flags.DEFINE_string('out', experiments.DEFAULT_OUT, 'Directory for the PNG and JSON files.')
_QUICK = flags.DEFINE_bool('quick', False, 'Small version of each experiment (seconds; for tests).')
_RESUME = flags.DEFINE_bool(
    'resume', False, 'Skip an experiment whose DIR/NAME.json a run with the same --quick and '
    '--seeds already wrote (e.g. after `all` stopped part way); its table is still printed.')
_SEEDS = flags.DEFINE_integer('seeds', None, 'Number of seeds, for the experiments that repeat '
                              'over seeds (default: each experiment\'s own).', lower_bound=1)


def main(argv):
  logging.set_verbosity(logging.WARNING)  # the trainer's progress lines (router study)
  quiet_logs.quiet_library_logs()  # e.g. Orbax's read-only notes when few-shot restores
  if len(argv) != 2:
    print(f"experiments: error: give one experiment name ({', '.join(experiments.NAMES)}) "
          'or all', file=sys.stderr)
    sys.exit(2)
  name = argv[1]
  names = experiments.NAMES if name == 'all' else (name,)
  try:
    for n in names:
      experiments.load(n)
  except ValueError as e:
    print(f'experiments: error: {e}', file=sys.stderr)
    sys.exit(2)
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


if __name__ == '__main__':
  app.run(main)
