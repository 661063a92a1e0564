"""Start from other weights, on the embedded data: pre-train, upcycle, fine-tune, evaluate.

The workflow a V-MoE user runs with released weights, end to end at toy scale,
through the public entry points (`train.trainer.train_and_evaluate` with
`config.initialization`, and the standalone evaluation job):

1. pre-train a dense ViT (`model.name='vit'`, the tiny MNIST config's sizes) on
   MNIST for P steps;
2. upcycle it into the tiny V-MoE (every expert of blocks 1 and 3 a copy of the
   dense MLP) with each router, and train U more steps on MNIST;
3. fine-tune that on scikit-learn's digits at 21 x 21 px (a 3 x 3 patch grid
   instead of 4 x 4: the position embedding is resized; a new head) for F steps;
4. evaluate the fine-tuned model on the digits test split at capacity factors
   1.0 and 0.5, with and without batch priority routing.

Baselines, same seeds: the V-MoE trained from scratch on MNIST for P + U steps
(the upcycled run's total), and the V-MoE trained from scratch on digits for F
steps (what fine-tuning buys). Numbers are means and sample standard deviations
over seeds.
"""
from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any

import jax
import numpy as np

from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import experiments
from vmoe_sparse_ot.evaluate import job
from vmoe_sparse_ot.experiments import style
from vmoe_sparse_ot.train import trainer

NAME = 'upcycle_finetune'
CONFIG_FILE = pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'vmoe_tiny_mnist.py'
ROUTERS = ('topk', 'sbase', 'sparse_ot', 'expert_choice')
FULL = {'pretrain': 300, 'upcycle': 150, 'finetune': 150, 'seeds': 3}
QUICK = {'pretrain': 3, 'upcycle': 2, 'finetune': 2, 'seeds': 1}
DIGITS_SIZE = 21
EVALS = ((1.0, False), (1.0, True), (0.5, False), (0.5, True))


def make_config(router: str, steps: int, seed: int, *, dense: bool = False,
                digits: bool = False, init: str | None = None, quick: bool = False):
  """The tiny MNIST config for one run; `quick` shrinks it (`experiments.QUICK_MODEL`)."""
  config = config_lib.load_config_file(f'{CONFIG_FILE}:router={router},steps={steps}')
  if quick:
    experiments.shrink_for_quick(config)
  config.seed = seed
  config.model.name = 'vit' if dense else 'vit_moe'
  config.schedule.warmup_steps = max(1, min(50, steps // 5))
  config.schedule.decay_steps = None
  if quick:  # One schedule for every length: runs of one model share their programs.
    config.schedule.warmup_steps, config.schedule.decay_steps = 1, 100
  config.checkpoint.every_steps = steps
  config.log_every_steps = max(1, steps // 3)
  config.eval_every_steps = 0
  if digits:
    config.dataset.name, config.dataset.image_size = 'sklearn_digits', DIGITS_SIZE
    config.dataset.train_split, config.dataset.eval_split = 'train', 'test'
    config.dataset.shuffle_buffer = 1437
  elif quick:
    config.dataset.eval_split = 'test[:500]'
  config.initialization.path = init
  return config


def _train(config, workdir: str) -> float:
  return 100 * trainer.train_and_evaluate(config, workdir)['eval']['accuracy']


def _evaluate(workdir: str, capacity_factor: float, batch_priority: bool) -> dict[str, float]:
  request = job.prepare(workdir, capacity_factor=capacity_factor, batch_priority=batch_priority)
  payload = job.run(request)
  dropped = np.mean([r['dropped_fraction'] for r in payload['routing'].values()])
  return {'top1': 100 * payload['metrics']['accuracy'], 'dropped': 100 * float(dropped)}


def run_seed(router: str, seed: int, budget: dict[str, int], tmp: str,
             dense_dir: str, quick: bool = False) -> dict[str, Any]:
  p, u, f = budget['pretrain'], budget['upcycle'], budget['finetune']
  up_dir, ft_dir = (os.path.join(tmp, f'{router}_{seed}_{n}') for n in ('up', 'ft'))
  out = {'upcycled_mnist': _train(make_config(router, u, seed, init=dense_dir, quick=quick),
                                  up_dir)}
  out['scratch_mnist'] = _train(make_config(router, p + u, seed, quick=quick),
                                os.path.join(tmp, f'{router}_{seed}_scratch'))
  out['finetuned_digits'] = _train(
      make_config(router, f, seed, digits=True, init=up_dir, quick=quick), ft_dir)
  out['scratch_digits'] = _train(make_config(router, f, seed, digits=True, quick=quick),
                                 os.path.join(tmp, f'{router}_{seed}_digits'))
  for cf, bpr in EVALS:
    out[f'eval_cf{cf}_bpr{int(bpr)}'] = _evaluate(ft_dir, cf, bpr)
  return out


def _stats(values) -> dict[str, float]:
  values = np.asarray(values, np.float64)
  return {'mean': float(values.mean()),
          'std': float(values.std(ddof=1)) if len(values) > 1 else 0.0}


def run(out_dir: str, *, quick: bool = False, seeds: int | None = None) -> dict:
  budget = dict(QUICK if quick else FULL)
  seeds = seeds or budget['seeds']
  routers = ROUTERS[:1] if quick else ROUTERS
  raw: dict[str, list] = {r: [] for r in routers}
  dense = []
  saved_cache = (jax.config.jax_compilation_cache_dir,
                 jax.config.jax_persistent_cache_min_compile_time_secs)
  with tempfile.TemporaryDirectory(prefix='upcycle_finetune_') as tmp:
    # Seeds repeat the same programs: compile each once (a cache of the run's own
    # unless one is set; the process's settings are put back after).
    if not saved_cache[0]:
      jax.config.update('jax_compilation_cache_dir', os.path.join(tmp, 'xla_cache'))
      jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)
    try:
      for seed in range(seeds):
        dense_dir = os.path.join(tmp, f'dense_{seed}')
        dense.append(_train(make_config('topk', budget['pretrain'], seed, dense=True,
                                        quick=quick), dense_dir))
        for router in routers:
          raw[router].append(run_seed(router, seed, budget, tmp, dense_dir, quick))
          print(f'seed {seed} {router}: {raw[router][-1]}', flush=True)
    finally:
      jax.config.update('jax_compilation_cache_dir', saved_cache[0])
      jax.config.update('jax_persistent_cache_min_compile_time_secs', saved_cache[1])
  rows = {}
  for router, runs in raw.items():
    row = {k: _stats([r[k] for r in runs]) for k in
           ('upcycled_mnist', 'scratch_mnist', 'finetuned_digits', 'scratch_digits')}
    for cf, bpr in EVALS:
      key = f'eval_cf{cf}_bpr{int(bpr)}'
      row[key] = {m: _stats([r[key][m] for r in runs]) for m in ('top1', 'dropped')}
    rows[router] = row
  payload = {'budget_steps': budget, 'num_seeds': seeds, 'dense_mnist': _stats(dense),
             'digits_image_size': DIGITS_SIZE, 'routers': rows, 'raw': raw}
  payload['figure'] = plot(payload, os.path.join(out_dir, f'{NAME}.png'))
  return payload


PANELS = (('MNIST', (('upcycled_mnist', 'upcycled'), ('scratch_mnist', 'from scratch'))),
          ('digits', (('finetuned_digits', 'fine-tuned'), ('scratch_digits', 'from scratch'))))


def plot(payload: dict, path: str) -> str:
  """Top-1 per router, upcycled or fine-tuned beside from scratch (bars: mean, ticks: std)."""
  routers = list(payload['routers'])
  b = payload['budget_steps']
  fig, axes = style.figure(1, 2, width=8.5, height=3.4, title=(
      f"Upcycling and fine-tuning, {payload['num_seeds']} seed(s): {b['pretrain']} dense "
      f"steps + {b['upcycle']} upcycled on MNIST, {b['finetune']} fine-tuning steps on "
      f"digits at {payload['digits_image_size']} px"))
  x = np.arange(len(routers))
  for ax, (data, bars) in zip(axes[0], PANELS):
    # The bars differ by fractions of a point near the top: start the axis below them.
    low = min(payload['routers'][r][k]['mean'] - payload['routers'][r][k]['std']
              for r in routers for k, _ in bars)
    ax.set_ylim(max(0.0, 5 * np.floor(low / 5) - 5), 100)
    for i, (key, label) in enumerate(bars):
      means = [payload['routers'][r][key]['mean'] for r in routers]
      stds = [payload['routers'][r][key]['std'] for r in routers]
      ax.bar(x + (i - 0.5) * 0.38, means, 0.38, yerr=stds, capsize=3, label=label)
    ax.set_xticks(x, routers)
    ax.set_ylabel(f'{data} test top-1 (%)')
    ax.set_title(data)
    ax.legend(loc='upper left', ncols=2, frameon=False)
  return style.save(fig, path)


def _ms(s: dict[str, float]) -> str:
  return f"{s['mean']:5.1f} ± {s['std']:3.1f}"


def format_table(payload: dict) -> str:
  b = payload['budget_steps']
  lines = [
      f"Upcycle and fine-tune, {payload['num_seeds']} seed(s); dense ViT pre-trained "
      f"{b['pretrain']} steps on MNIST (top-1 {_ms(payload['dense_mnist'])}), upcycled "
      f"+{b['upcycle']}, fine-tuned {b['finetune']} on digits at "
      f"{payload['digits_image_size']} px. Top-1 %, mean ± std over seeds.",
      f"{'router':14s} {'MNIST upcyc':>12s} {'MNIST scratch':>13s} {'digits ft':>12s} "
      f"{'digits scratch':>14s} | digits ft at eval: cf1.0 / cf1.0+BPR / cf0.5 / cf0.5+BPR "
      '(dropped %)',
  ]
  for router, row in payload['routers'].items():
    evals = ' / '.join(f"{row[f'eval_cf{cf}_bpr{int(bpr)}']['top1']['mean']:.1f}"
                       f" ({row[f'eval_cf{cf}_bpr{int(bpr)}']['dropped']['mean']:.0f})"
                       for cf, bpr in EVALS)
    lines.append(f"{router:14s} {_ms(row['upcycled_mnist']):>12s} "
                 f"{_ms(row['scratch_mnist']):>13s} {_ms(row['finetuned_digits']):>12s} "
                 f"{_ms(row['scratch_digits']):>14s} | {evals}")
  return '\n'.join(lines)
