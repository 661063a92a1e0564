"""Shared by the benchmarks that train this project's tiny configs on the embedded MNIST
(e3.py, soft_moe_recipe.py): their common flags and set-up, a config for one scored
run, the whole test split, and the mean ± std they print."""
import argparse
import os
import statistics
import tempfile

import jax
import numpy as np
from absl import logging

from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import data as data_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, list[int]]:
  """`parser`'s arguments plus --seeds (comma-separated) and --json; then quiets the
  trainer's INFO lines and points JAX's compilation cache at the benchmarks' own
  directory (runs of one model share their programs). (args, seeds)."""
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--json', default=None)
  args = parser.parse_args()
  logging.set_verbosity(logging.WARNING)
  jax.config.update('jax_compilation_cache_dir',
                    os.path.join(tempfile.gettempdir(), 'vmoe_sparse_ot_bench_xla_cache'))
  return args, [int(s) for s in args.seeds.split(',')]


def config(name: str, arg: str, steps: int, seed: int):
  """configs/`name`[:`arg`] for `steps` steps of `seed`, checkpointed at the end; the
  trainer's own evaluation is cut to 500 test images (the benchmarks score the runs)."""
  path = os.path.join(ROOT, 'configs', name) + (f':{arg}' if arg else '')
  cfg = config_lib.load_config_file(path)
  cfg.unlock()
  cfg.seed = seed
  cfg.train_steps = steps
  cfg.log_every_steps = max(steps // 4, 1)
  cfg.eval_every_steps = 0
  cfg.dataset.eval_split = 'test[:500]'
  cfg.checkpoint.every_steps = steps
  cfg.lock()
  return cfg


def test_set():
  """(images, labels) of the whole embedded MNIST test split (10k), 28 x 28 x 1 in [-1, 1]."""
  ds = data_lib.make_dataset('embedded_mnist', 'test', batch_size=1000, image_size=28,
                             channels=1, training=False,
                             pp='decode(channels=1)|resize(28)|value_range(-1, 1)')
  images, labels = [], []
  for batch in ds.as_numpy_iterator():
    images.append(batch['image'][batch['mask']])
    labels.append(batch['label'][batch['mask']])
  return np.concatenate(images), np.concatenate(labels)


def mean_std(values, fmt: str = '.4f') -> str:
  """'mean ± sample std' of `values` (std 0 for one value)."""
  values = list(values)
  std = statistics.stdev(values) if len(values) > 1 else 0.0
  return f'{statistics.mean(values):{fmt}} ± {std:{fmt}}'
