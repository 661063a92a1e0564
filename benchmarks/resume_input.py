"""Time to the first training batch after a restart at step t, 'index' vs 'stream' sampling.

A restarted run builds its input pipeline at `start_step=t` and waits for the
first batch; this measures that wait (pipeline construction included) for each
t, on embedded MNIST (50k records, tfrecord). 'index' reads the first batch's
records at computed positions (plus the one-off scan of the tfrecord headers,
cleared before every measurement as in a fresh process); 'stream' (the former
pipeline) skips t * b records through its shuffle buffer first.

  PYTHONPATH=. .venv/bin/python benchmarks/resume_input.py
"""
import argparse
import time

from vmoe_sparse_ot import data
from vmoe_sparse_ot.data import records

PP = 'decode(channels=1)|value_range(-1, 1)'


def first_batch_seconds(sampling: str, step: int, batch_size: int,
                        shuffle_buffer: int) -> tuple[float, int]:
  """(seconds to build the pipeline and get its first batch, records read by `read`)."""
  records.tfrecord_offsets.cache_clear()
  with records.counting_reads() as count:
    start = time.perf_counter()
    ds = data.make_dataset('embedded_mnist', 'train', batch_size=batch_size, image_size=28,
                           channels=1, training=True, pp=PP, shuffle_buffer=shuffle_buffer,
                           process_index=0, process_count=1, start_step=step,
                           sampling=sampling)
    next(ds.as_numpy_iterator())
    return time.perf_counter() - start, count[0]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, nargs='+', default=[1_000, 100_000, 1_000_000])
  parser.add_argument('--batch_size', type=int, default=64)
  parser.add_argument('--shuffle_buffer', type=int, default=10_000)
  parser.add_argument('--stream_max_step', type=int, default=1_000_000,
                      help="skip 'stream' at larger steps (its time grows with the step)")
  args = parser.parse_args()
  first_batch_seconds('index', 0, args.batch_size, args.shuffle_buffer)  # Warm up TF.
  first_batch_seconds('stream', 0, args.batch_size, args.shuffle_buffer)
  print('| sampling | restart step | records skipped before it | records read (`index`) '
        '| s to first batch |')
  print('|---|---:|---:|---:|---:|')
  for sampling in ('index', 'stream'):
    for step in args.steps:
      if sampling == 'stream' and step > args.stream_max_step:
        continue
      seconds, read = first_batch_seconds(sampling, step, args.batch_size, args.shuffle_buffer)
      skipped = step * args.batch_size if sampling == 'stream' else 0
      shown = read if sampling == 'index' else '-'
      print(f'| {sampling} | {step:,} | {skipped:,} | {shown} | {seconds:.2f} |', flush=True)


if __name__ == '__main__':
  main()
