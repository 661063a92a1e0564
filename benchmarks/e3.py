"""E³ (M = 2) against the V-MoE it is fine-tuned from, on the embedded MNIST.

1. Pre-trains one V-MoE (configs/vmoe_tiny_mnist.py, topk router, K = 2) for
   `--pretrain-steps` steps (seed 0).
2. For each seed, fine-tunes from that checkpoint, for `--steps` steps each and
   with the same recipe (configs/e3_tiny_mnist.py):
   - the V-MoE (`members=1,k=2`: each token reaches 2 experts);
   - E³ (`members=2,k=1`: each member's copy of a token reaches 1 of its 4
     experts, 2 experts per token in all, as the reference's E³ config).
   The two runs alternate within a seed, so machine load hits both alike.
3. Scores both on the whole test split (10k images) with `vmoe_sparse_ot.load`:
   top-1, NLL and ECE (15 bins) of the prediction (for E³ the mean of the
   members' probabilities, and each member alone), and reads each run's
   steady-state train-step time (the trainer's steps after the first) and
   XLA's FLOP count of its train step (`flops_per_step`, train/compute.py).

    PYTHONPATH=. python benchmarks/e3.py [--seeds 0,1,2] [--steps 200] [--json out.json]
"""
import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

import tiny_mnist  # noqa: E402  (the benchmarks folder is sys.path[0])
from tiny_mnist import mean_std  # noqa: E402
import vmoe_sparse_ot  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import losses  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import trainer  # pylint: disable=wrong-import-position



def _train(config, workdir: str) -> dict:
  start = time.time()
  summary = trainer.train_and_evaluate(config, workdir)
  return {'steps_per_sec': summary['steps_per_sec'], 'wall_seconds': time.time() - start,
          'gflops_per_step': summary['flops_per_step'] / 1e9}


def _scores(log_probs: np.ndarray, labels: np.ndarray) -> dict:
  batch = {'label': labels}
  nll = -np.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
  bins = losses.calibration_bins(log_probs, batch, np.ones(labels.shape, bool))
  return {'top1': float(np.mean(np.argmax(log_probs, -1) == labels)),
          'nll': float(np.mean(nll)), 'ece': losses.expected_calibration_error(bins)}


def _evaluate(workdir: str, images, labels) -> dict:
  model = vmoe_sparse_ot.load(workdir, batch_size=500)
  out = model.outputs(images)
  result = _scores(np.asarray(out['logits'] if model.ensemble_size > 1 else
                              jax.nn.log_softmax(out['logits'])), labels)
  if model.ensemble_size > 1:
    result['members'] = [_scores(np.asarray(jax.nn.log_softmax(out['member_logits'][:, m])),
                                 labels) for m in range(model.ensemble_size)]
  return result


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--pretrain-steps', type=int, default=300)
  parser.add_argument('--steps', type=int, default=200)
  args, seeds = tiny_mnist.parse_args(parser)
  start = time.time()
  images, labels = tiny_mnist.test_set()
  runs = {'vmoe': [], 'e3': []}
  with tempfile.TemporaryDirectory() as root:
    pretrained = os.path.join(root, 'pretrained')
    _train(tiny_mnist.config('vmoe_tiny_mnist.py', 'router=topk', args.pretrain_steps, 0),
           pretrained)
    base = _evaluate(pretrained, images, labels)
    print(f'pre-trained V-MoE ({args.pretrain_steps} steps): {base}', file=sys.stderr, flush=True)
    for seed in seeds:
      for name, arg in (('vmoe', 'members=1,k=2'), ('e3', 'members=2,k=1')):
        workdir = os.path.join(root, f'{name}_{seed}')
        config = tiny_mnist.config('e3_tiny_mnist.py', f'init={pretrained},{arg}', args.steps,
                                   seed)
        cost = _train(config, workdir)
        result = {'seed': seed, **cost, **_evaluate(workdir, images, labels)}
        runs[name].append(result)
        print(f'seed {seed} {name}: {result}', file=sys.stderr, flush=True)
  ratios = [v['steps_per_sec'] / e['steps_per_sec'] for v, e in zip(runs['vmoe'], runs['e3'])]
  report = {'devices': jax.device_count(), 'cpu_count': os.cpu_count(), 'seeds': seeds,
            'pretrain_steps': args.pretrain_steps, 'finetune_steps': args.steps,
            'pretrained': base, 'runs': runs, 'step_time_ratio_e3_over_vmoe': ratios,
            'wall_seconds': time.time() - start}
  print(f'| model (fine-tuned {args.steps} steps from the same V-MoE, {len(seeds)} seeds) '
        '| top-1 | NLL | ECE | train step, ms | train step, GFLOPs |')
  print('| --- | ---: | ---: | ---: | ---: | ---: |')
  print(f'| pre-trained V-MoE, K=2 (no fine-tuning) | {base["top1"]:.4f} | {base["nll"]:.4f} '
        f'| {base["ece"]:.4f} | | |')
  rows = [('V-MoE, K=2', runs['vmoe'], None), ('E³, M=2, K=1 (mean of probabilities)',
                                                runs['e3'], None)]
  rows += [(f'E³ member {m} alone', runs['e3'], m) for m in range(2)]
  for title, rs, member in rows:
    pick = (lambda r: r) if member is None else (lambda r, m=member: r['members'][m])
    step_ms = '' if member is not None else mean_std(1000 / r['steps_per_sec'] for r in rs)
    gflops = '' if member is not None else f"{rs[0]['gflops_per_step']:.3f}"
    print(f'| {title} | {mean_std(pick(r)["top1"] for r in rs)} | '
          f'{mean_std(pick(r)["nll"] for r in rs)} | {mean_std(pick(r)["ece"] for r in rs)} '
          f'| {step_ms} | {gflops} |')
  print(f'\nE³ / V-MoE train-step time: {mean_std(ratios)} (per seed: '
        f'{", ".join(f"{r:.2f}" for r in ratios)}); total wall {report["wall_seconds"]:.0f}s')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(report, f, indent=2)


if __name__ == '__main__':
  main()
