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
(argmax of the logits, whatever the loss), the parameter count, and the
steady-state train-step time (the trainer's steps after the first).

    PYTHONPATH=. python benchmarks/soft_moe_recipe.py [--seeds 0,1,2] [--steps 500] [--json F]
"""
import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
from absl import logging  # pylint: disable=wrong-import-position

import vmoe_sparse_ot  # pylint: disable=wrong-import-position
from vmoe_sparse_ot import config as config_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot import data as data_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import trainer  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = (('recipe', 'softmoe_tiny_mnist.py', ''),
          ('before', 'vmoe_tiny_mnist.py', 'router=soft_moe'))


def _config(name: str, arg: str, steps: int, seed: int):
  path = os.path.join(ROOT, 'configs', name) + (f':{arg}' if arg else '')
  config = config_lib.load_config_file(path)
  config.unlock()
  config.seed = seed
  config.train_steps = steps
  config.log_every_steps = max(steps // 4, 1)
  config.eval_every_steps = 0
  config.dataset.eval_split = 'test[:500]'   # The trainer's own final eval; scored below.
  config.checkpoint.every_steps = steps
  config.lock()
  return config


def _test_set():
  ds = data_lib.make_dataset('embedded_mnist', 'test', batch_size=1000, image_size=28,
                             channels=1, training=False,
                             pp='decode(channels=1)|resize(28)|value_range(-1, 1)')
  images, labels = [], []
  for batch in ds.as_numpy_iterator():
    images.append(batch['image'][batch['mask']])
    labels.append(batch['label'][batch['mask']])
  return np.concatenate(images), np.concatenate(labels)


def _mean_std(values, fmt='.4f') -> str:
  values = list(values)
  std = statistics.stdev(values) if len(values) > 1 else 0.0
  return f'{statistics.mean(values):{fmt}} ± {std:{fmt}}'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--steps', type=int, default=500)
  parser.add_argument('--json', default=None)
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_compilation_cache_dir',
                    os.path.join(tempfile.gettempdir(), 'vmoe_sparse_ot_bench_xla_cache'))
  seeds = [int(s) for s in args.seeds.split(',')]
  start = time.time()
  images, labels = _test_set()
  runs = {name: [] for name, _, _ in MODELS}
  with tempfile.TemporaryDirectory() as root:
    for seed in seeds:
      for name, file, arg in MODELS:
        workdir = os.path.join(root, f'{name}_{seed}')
        summary = trainer.train_and_evaluate(_config(file, arg, args.steps, seed), workdir)
        model = vmoe_sparse_ot.load(workdir, batch_size=500)
        logits = np.asarray(model.outputs(images)['logits'])
        runs[name].append({
            'seed': seed, 'top1': float(np.mean(np.argmax(logits, -1) == labels)),
            'step_ms': 1000 / summary['steps_per_sec'],
            'params': int(sum(x.size for x in jax.tree.leaves(model.params)))})
        print(f'seed {seed} {name}: {runs[name][-1]}', flush=True)
  print(f'\n| model ({args.steps} steps from scratch, {len(seeds)} seeds) | parameters '
        '| top-1 (10k test) | train step, ms |')
  print('| --- | ---: | ---: | ---: |')
  for name, file, arg in MODELS:
    rs = runs[name]
    print(f"| {name}: configs/{file}{':' + arg if arg else ''} | {rs[0]['params']:,} | "
          f"{_mean_std(r['top1'] for r in rs)} | {_mean_std((r['step_ms'] for r in rs), '.1f')} |")
  ratios = [r['step_ms'] / b['step_ms'] for r, b in zip(runs['recipe'], runs['before'])]
  print(f'\nrecipe / before train-step time: {_mean_std(ratios, ".2f")}; '
        f'total wall {time.time() - start:.0f} s')
  if args.json:
    with open(args.json, 'w') as f:
      json.dump({'seeds': seeds, 'steps': args.steps, 'runs': runs, 'ratios': ratios}, f,
                indent=2)


if __name__ == '__main__':
  main()
