"""Prepares embedded datasets: `python -m vmoe_sparse_ot.data [NAME ...] [--data_dir DIR]`.

Idempotent: a prepared dataset is only reported. Training prepares on first use
anyway; this makes the step explicit (and timed) in scripts.
"""
import argparse
import time

from vmoe_sparse_ot.data import embedded


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('names', nargs='*', default=sorted(embedded.BUILDERS),
                      help=f'datasets to prepare (default: {sorted(embedded.BUILDERS)})')
  parser.add_argument('--data_dir', default=None, help='TFDS data_dir (default: '
                      '$VMOE_DATA_DIR or ~/.cache/vmoe_sparse_ot/tfds)')
  args = parser.parse_args()
  for name in args.names:
    start = time.time()
    builder = embedded.builder(name, args.data_dir)
    splits = ', '.join(f'{k} {v.num_examples}' for k, v in sorted(builder.info.splits.items()))
    print(f'{name}: {splits} in {builder.data_dir} ({time.time() - start:.1f}s)', flush=True)


if __name__ == '__main__':
  main()
