"""Training throughput (images/s) of configs/vmoe_tiny_mnist.py per router.

Runs the real trainer (input pipeline, jitted sharded step, logging, checkpoint at
the end) for `--steps` steps per router and reads its steady-state throughput from
summary['images_per_sec']: the steps after the first one (which holds
compilation) divided by their wall time (evaluation and checkpoint waits
excluded), times the global batch. Routers run round-robin for `--rounds` rounds
so that load from other processes hits them alike; compilations after the first
round come from a persistent cache. Reports the best and the median round.

    python benchmarks/train_throughput.py [--steps 300] [--rounds 2] [--json out.json]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
from absl import logging  # pylint: disable=wrong-import-position

from vmoe_sparse_ot import config as config_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import trainer  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUTERS = ('topk', 'sbase', 'sparse_ot', 'expert_choice')


def run_once(router: str, steps: int) -> dict:
  config = config_lib.load_config_file(
      os.path.join(ROOT, 'configs', 'vmoe_tiny_mnist.py') + f':router={router},steps={steps}')
  config.log_every_steps = max(steps // 5, 1)
  config.eval_every_steps = 0
  config.dataset.eval_split = 'test[:1000]'
  config.checkpoint.every_steps = steps
  with tempfile.TemporaryDirectory() as workdir:
    start = time.time()
    summary = trainer.train_and_evaluate(config, workdir)
    wall = time.time() - start
  return {'images_per_sec': summary['images_per_sec'], 'steps_per_sec': summary['steps_per_sec'],
          'final_train_loss': summary['final_train_loss'], 'wall_seconds': wall,
          'batch_size': config.batch_size}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--routers', default=','.join(ROUTERS))
  parser.add_argument('--json', default=None, help='also write the results here')
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_compilation_cache_dir',
                    os.path.join(tempfile.gettempdir(), 'vmoe_sparse_ot_bench_xla_cache'))
  routers = args.routers.split(',')
  results = {r: [] for r in routers}
  for round_index in range(args.rounds):
    for router in routers:
      result = run_once(router, args.steps)
      results[router].append(result)
      print(f'round {round_index} {router}: {result["images_per_sec"]:.0f} images/s '
            f'({result["steps_per_sec"]:.2f} steps/s, loss {result["final_train_loss"]:.3f}, '
            f'{result["wall_seconds"]:.0f}s wall)', file=sys.stderr, flush=True)
  report = {
      'devices': jax.device_count(), 'cpu_count': os.cpu_count(), 'steps': args.steps,
      'rounds': args.rounds, 'load_average_end': os.getloadavg(),
      'routers': {r: {'best_images_per_sec': max(x['images_per_sec'] for x in v),
                      'median_images_per_sec': statistics.median(x['images_per_sec'] for x in v),
                      'runs': v} for r, v in results.items()},
  }
  print('| router | images/s (best) | images/s (median) |')
  print('| --- | ---: | ---: |')
  for router, r in report['routers'].items():
    print(f'| {router} | {r["best_images_per_sec"]:.0f} | {r["median_images_per_sec"]:.0f} |')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(report, f, indent=2)


if __name__ == '__main__':
  main()
