"""Prepares embedded datasets: `python -m vmoe_sparse_ot.data [NAME ...] [--data_dir DIR]`.

Idempotent: a prepared dataset is only reported. Training prepares on first use
anyway; this makes the step explicit (and timed) in scripts. A mistake (an unknown
name, a data_dir under a regular file, a missing source package) is one line on
stderr and exit status 2.
"""
import sys
import time

from vmoe_sparse_ot import errors
from vmoe_sparse_ot import quiet_logs
from vmoe_sparse_ot.data import embedded

# The embedded datasets' names, known without importing TensorFlow (so that
# --help and argument errors print nothing else); tests check they match.
NAMES = ('embedded_mnist', 'sklearn_digits')


def _parse(argv):
  parser = errors.ArgumentParser(
      prog='python -m vmoe_sparse_ot.data',
      description='Writes the embedded offline datasets as TFDS datasets under a data_dir.')
  parser.add_argument('names', nargs='*', metavar='NAME', default=list(NAMES),
                      help=f'datasets to prepare, among {", ".join(NAMES)} (default: all)')
  parser.add_argument('--data_dir', default=None, help='TFDS data_dir (default: '
                      '$VMOE_DATA_DIR or ~/.cache/vmoe_sparse_ot/tfds)')
  args = parser.parse_args(argv)
  unknown = [n for n in args.names if n not in NAMES]
  if unknown:
    parser.error(f'unknown dataset {unknown[0]!r}; choose from {", ".join(NAMES)}')
  return args


def main(argv=None) -> None:
  args = _parse(sys.argv[1:] if argv is None else argv)
  quiet_logs.setup_environment()
  # lazy: config imports JAX and Flax (seconds); --help and a bad name answer without them
  from vmoe_sparse_ot.config import preflight  # pylint: disable=g-import-not-at-top
  quiet_logs.quiet_library_logs()
  data_dir = args.data_dir or embedded.default_data_dir()
  prog = 'python -m vmoe_sparse_ot.data'
  try:
    preflight.make_directory(data_dir, '--data_dir')
    for name in args.names:
      start = time.time()
      builder = embedded.builder(name, data_dir)
      splits = ', '.join(f'{k} {v.num_examples}'
                         for k, v in sorted(builder.info.splits.items()))
      print(f'{name}: {splits} in {builder.data_dir} ({time.time() - start:.1f}s)',
            flush=True)
  except (OSError, ValueError) as e:
    errors.fail(prog, e)


if __name__ == '__main__':
  main()
