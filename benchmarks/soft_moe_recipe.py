"""The Soft MoE recipe's model against this project's earlier Soft MoE model, equal steps.

Both are trained from scratch on the embedded MNIST for `--steps` steps per seed,
batch 128, and scored on the whole test split (10k images) with
`vmoe_sparse_ot.load`:

- recipe: configs/softmoe_tiny_mnist.py -- qk-norm, global average pooling, head
  bias -log(10), sigmoid cross-entropy, MoE in the last 2 blocks with `num_slots`
  = 2 per expert, one group per image, the recipe's weight decays (the Soft MoE
  paper's model at the tiny config's size);
- before: configs/vmoe_tiny_mnist.py:router=soft_moe -- the tiny V-MoE (class
  token, MoE in blocks 1 and 3, softmax cross-entropy) with the soft_moe router
  and its slots from the capacity factor.

The two alternate within a seed, so machine load hits both alike. Reported: top-1
(argmax of the logits, whatever the loss), the parameter count, the
steady-state train-step time (the trainer's steps after the first) and XLA's
FLOP count of the train step (`flops_per_step`, train/compute.py).

    PYTHONPATH=. python benchmarks/soft_moe_recipe.py [--seeds 0,1,2] [--steps 500] [--json F]
"""
import argparse
import json
import os
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

import tiny_mnist  # noqa: E402  (the benchmarks folder is sys.path[0])
from tiny_mnist import mean_std  # noqa: E402
import vmoe_sparse_ot  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import trainer  # pylint: disable=wrong-import-position

MODELS = (('recipe', 'softmoe_tiny_mnist.py', ''),
          ('before', 'vmoe_tiny_mnist.py', 'router=soft_moe'))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=500)
  args, seeds = tiny_mnist.parse_args(parser)
  start = time.time()
  images, labels = tiny_mnist.test_set()
  runs = {name: [] for name, _, _ in MODELS}
  with tempfile.TemporaryDirectory() as root:
    for seed in seeds:
      for name, file, arg in MODELS:
        workdir = os.path.join(root, f'{name}_{seed}')
        config = tiny_mnist.config(file, arg, args.steps, seed)
        summary = trainer.train_and_evaluate(config, workdir)
        model = vmoe_sparse_ot.load(workdir, batch_size=500)
        logits = np.asarray(model.outputs(images)['logits'])
        runs[name].append({
            'seed': seed, 'top1': float(np.mean(np.argmax(logits, -1) == labels)),
            'step_ms': 1000 / summary['steps_per_sec'],
            'gflops_per_step': summary['flops_per_step'] / 1e9,
            'params': int(sum(x.size for x in jax.tree.leaves(model.params)))})
        print(f'seed {seed} {name}: {runs[name][-1]}', flush=True)
  print(f'\n| model ({args.steps} steps from scratch, {len(seeds)} seeds) | parameters '
        '| top-1 (10k test) | train step, ms | train step, GFLOPs |')
  print('| --- | ---: | ---: | ---: | ---: |')
  for name, file, arg in MODELS:
    rs = runs[name]
    print(f"| {name}: configs/{file}{':' + arg if arg else ''} | {rs[0]['params']:,} | "
          f"{mean_std(r['top1'] for r in rs)} | {mean_std((r['step_ms'] for r in rs), '.1f')} | "
          f"{rs[0]['gflops_per_step']:.3f} |")
  ratios = [r['step_ms'] / b['step_ms'] for r, b in zip(runs['recipe'], runs['before'])]
  print(f'\nrecipe / before train-step time: {mean_std(ratios, ".2f")}; '
        f'total wall {time.time() - start:.0f} s')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'seeds': seeds, 'steps': args.steps, 'runs': runs, 'ratios': ratios}, f,
                indent=2)


if __name__ == '__main__':
  main()
