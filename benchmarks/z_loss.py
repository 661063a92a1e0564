"""The router z-loss in a bfloat16 tiny run: the same run with and without it.

configs/vmoe_tiny_mnist.py (topk router) with `model.dtype='bfloat16'`, trained
`--steps` steps per seed with `router.z_loss_weight` 0 and `--weight` (ST-MoE's
1e-3 by default), alternating within a seed. Reported per run, from its
metrics.jsonl and summary: the trainer's eval top-1 (500 test images), the last
interval's train loss, and per MoE layer (averaged over layers) the router
health of the first and last logged intervals: `z_loss` (mean logsumexp^2 of the
logits), `router_entropy`, `router_top_prob`, `empty_experts`, and the dropped
fraction; and the steady train-step time and XLA's FLOPs per step.

    PYTHONPATH=. python benchmarks/z_loss.py [--seeds 0] [--steps 300] [--weight 1e-3] [--json F]
"""
import argparse
import json
import os
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=wrong-import-position

import tiny_mnist  # noqa: E402  (the benchmarks folder is sys.path[0])
from tiny_mnist import mean_std  # noqa: E402
from vmoe_sparse_ot.train import metrics as metrics_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import trainer  # pylint: disable=wrong-import-position

HEALTH = ('z_loss', 'router_entropy', 'router_top_prob', 'empty_experts', 'dropped_fraction')


def _layer_means(row: dict) -> dict:
  """{name: mean over MoE layers} of a train row's `HEALTH` metrics."""
  return {name: float(np.mean([v for k, v in row.items()
                               if k.startswith('routing/') and k.endswith('/' + name)]))
          for name in HEALTH}


def _run(weight: float, steps: int, seed: int, workdir: str) -> dict:
  config = tiny_mnist.config('vmoe_tiny_mnist.py', 'router=topk', steps, seed)
  with config.unlocked():
    config.model.dtype = 'bfloat16'
    config.model.encoder.moe.router.z_loss_weight = weight
  summary = trainer.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, metrics_lib.METRICS_FILE)) as f:
    rows = [r for r in map(json.loads, f) if r['split'] == 'train']
  return {'weight': weight, 'seed': seed, 'top1': summary['eval']['accuracy'],
          'train_loss': summary['train_loss_last_interval_mean'],
          'first': _layer_means(rows[0]), 'last': _layer_means(rows[-1]),
          'step_ms': 1000 / summary['steps_per_sec'],
          'gflops_per_step': summary['flops_per_step'] / 1e9}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=300)
  parser.add_argument('--weight', type=float, default=1e-3)
  args, seeds = tiny_mnist.parse_args(parser)
  runs = []
  with tempfile.TemporaryDirectory() as root:
    for seed in seeds:
      for weight in (0.0, args.weight):
        runs.append(_run(weight, args.steps, seed, os.path.join(root, f'{weight}_{seed}')))
        print(f'seed {seed} z_loss_weight={weight}: {runs[-1]}', flush=True)
  print(f'\n| z_loss_weight ({args.steps} steps, bfloat16, {len(seeds)} seed(s)) | eval top-1 '
        '| train loss | ' + ' | '.join(f'{n} first → last' for n in HEALTH)
        + ' | step, ms | GFLOPs/step |')
  print('| --- |' + ' ---: |' * (4 + len(HEALTH)))
  for weight in (0.0, args.weight):
    rs = [r for r in runs if r['weight'] == weight]
    health = ' | '.join(f"{mean_std((r['first'][n] for r in rs), '.3f')} → "
                        f"{mean_std((r['last'][n] for r in rs), '.3f')}" for n in HEALTH)
    print(f"| {weight:g} | {mean_std(r['top1'] for r in rs)} | "
          f"{mean_std(r['train_loss'] for r in rs)} | {health} | "
          f"{mean_std((r['step_ms'] for r in rs), '.1f')} | {rs[0]['gflops_per_step']:.3f} |")
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'steps': args.steps, 'seeds': seeds, 'runs': runs}, f, indent=2)


if __name__ == '__main__':
  main()
