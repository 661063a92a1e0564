"""Router study: the paper's V-MoE tables, scaled down to the tiny MNIST V-MoE.

The paper (Section 5 table "Performance of the V-MoE B/32 and B/16 architectures
with different routers", and the appendix table "Total training TPUv2-core-days")
trains V-MoE B/32 and B/16 on JFT-300M with the TopK, S-BASE and
sparsity-constrained routers, then reports JFT precision@1, ImageNet 10-shot
linear transfer, and training cost. Here every router trains
`configs/vmoe_tiny_mnist.py` (4 blocks, D=64, E=8, K=2, C=k=16) on the embedded
MNIST for a few hundred steps, over several seeds, and reports

- test top-1 on MNIST (the upstream metric, standing in for JFT prec@1),
- 10-shot linear transfer on scikit-learn's 8x8 digits (standing in for
  ImageNet 10-shot; the protocol of `vmoe_sparse_ot.fewshot`, averaged over the
  config's 3 few-shot draws; the paper averages 5),
- how each router balances and drops, from the trainer's routing metrics of
  the last log interval, averaged over the MoE layers: MaxVio (max expert load
  over the mean load, minus 1; 0 when balanced), the fraction of tokens no
  expert processes, and experts per token,
- the compute of a train step, XLA's FLOP count of the compiled step per device
  (the trainer's `flops_per_step`, `train.compute`), for accuracy against FLOPs
  (XLA counts a loop's body once: sparse_ot's solver iterations count as one),
- training wall time as a ratio to TopK trained in the same round (standing in
  for TPUv2-core-days): seeds are the outer loop and routers the inner one, so
  every router sees the same load on a shared machine. (Step times measured
  side by side, with the compiled steps timed round-robin, are
  benchmarks/routers.py's.)

The full run uses capacity factor 0.75 (`CAPACITY_FACTOR`), below 1, so that
the token-choice routers must drop tokens and the routers differ in balance.
Expert-choice routers (`expert_choice`, `sinkhorn_ec`) count their capacity
from S/E, as the reference does; they get K times the factor, so that every
router has the same expert buffer size (E C = K S x 0.75 slots per group).

Each (budget, router, seed) trains in a temporary work directory through the
trainer's Python API (`train.trainer.train_and_evaluate`) and is then evaluated
by `evaluate.checkpoint_fewshot.run`. Routers the installed model does not know are
skipped with a printed note, so the same list works before and after a router lands.
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import errors
from vmoe_sparse_ot import experiments
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn import abstract_init
from vmoe_sparse_ot.config import fewshot_section as fewshot_config
from vmoe_sparse_ot.evaluate import checkpoint_fewshot
from vmoe_sparse_ot.experiments import style
from vmoe_sparse_ot.train import metrics as metrics_lib
from vmoe_sparse_ot.train import trainer

NAME = 'router_study'
# 'NAME:dropless' is router NAME with model.encoder.moe.dispatcher='dropless' (every
# choice computed, none dropped): the dropless baseline of a token-choice router.
ROUTERS = ('topk', 'topk:dropless', 'sbase', 'sparse_ot', 'expert_choice', 'sinkhorn_ec',
           'soft_moe', 'topk_bias')
# Capacity factor of the full run (below 1: token-choice routers must drop).
CAPACITY_FACTOR = 0.75
# Routers whose capacity counts from S/E (no K), as the reference's expert choice.
EXPERT_CHOICE = ('expert_choice', 'sinkhorn_ec')
# Routing metrics of the table: (trainer's name, label).
ROUTING_METRICS = (('max_load_violation', 'MaxVio'), ('dropped_fraction', 'dropped'),
                   ('experts_per_token', 'experts/token'))
CONFIG_FILE = pathlib.Path(__file__).resolve().parents[2] / 'configs' / 'vmoe_tiny_mnist.py'
# Full run: one budget (MNIST is close to saturated there; the balance columns
# are what tell the routers apart). `run(budgets=(300, 60))` adds a short budget
# and with it the marginal step time.
FULL_BUDGETS = (300,)
FULL_SEEDS = 5
QUICK_BUDGETS = (4,)
QUICK_ROUTERS = ('topk', 'sparse_ot')  # the paper's comparison
FEWSHOT_SHOTS = 10

# The paper's numbers (Section 5 table and appendix TPUv2-core-days table).
PAPER = {
    'B/32': {
        'topk': {'jft_prec1': 43.47, 'imagenet_10shot': 65.91, 'tpu_core_days': 97.11},
        'sbase': {'jft_prec1': 44.26, 'imagenet_10shot': 65.87, 'tpu_core_days': 98.88},
        'sparse_ot': {'jft_prec1': 44.30, 'imagenet_10shot': 66.52,
                      'tpu_core_days': 122.66},
    },
    'B/16': {
        'topk': {'jft_prec1': 48.86, 'imagenet_10shot': 72.12, 'tpu_core_days': 308.14},
        'sbase': {'jft_prec1': 49.80, 'imagenet_10shot': 72.26, 'tpu_core_days': 312.52},
        'sparse_ot': {'jft_prec1': 50.29, 'imagenet_10shot': 72.76,
                      'tpu_core_days': 433.56},
    },
}
ROUTER_LABELS = {'topk': 'TopK', 'sbase': 'S-BASE', 'sparse_ot': 'Sparsity-constrained',
                 'expert_choice': 'Expert choice', 'sinkhorn_ec': 'Sinkhorn EC',
                 'soft_moe': 'Soft MoE', 'topk_bias': 'TopK loss-free bias',
                 'topk:dropless': 'TopK dropless'}


def make_config(router: str, steps: int, seed: int, *, quick: bool):
  """`configs/vmoe_tiny_mnist.py` for `router` ('NAME' or 'NAME:dropless'), `steps`,
  `seed`; digits 10-shot."""
  router, _, dispatcher = router.partition(':')
  config = config_lib.load_config_file(f'{CONFIG_FILE}:router={router},steps={steps}')
  with config.unlocked():
    if dispatcher:
      config.model.encoder.moe.dispatcher = dispatcher
    config.seed = seed
    config.checkpoint.every_steps = steps  # Only the final checkpoint, for few-shot.
    config.checkpoint.async_save = False
    config.eval_every_steps = steps
    config.log_every_steps = max(1, steps // 3)
    config.schedule.warmup_steps = min(config.schedule.warmup_steps, max(1, steps // 5))
    config.fewshot.every_steps = 0
    config.fewshot.shots = (FEWSHOT_SHOTS,)
    config.fewshot.datasets = fewshot_config.transfer_datasets('digits')
    if not quick:
      router_config = config.model.encoder.moe.router
      k = router_config.num_selected_experts if router in EXPERT_CHOICE else 1
      router_config.capacity_factor = CAPACITY_FACTOR * k
    if quick:
      config.eval_batch_size = 200  # A multiple of 8 (the tests' fake devices).
      config.dataset.eval_split = 'test[:500]'
      config.fewshot.seeds = (0,)
  if quick:
    experiments.shrink_for_quick(config)
  return config


def router_available(config) -> tuple[bool, str]:
  """Whether the installed model builds with this config's router (abstract init)."""
  ds = config.dataset
  try:
    abstract_init.abstract_variables(nn.build_model(config.model),
                                     (ds.image_size, ds.image_size, ds.channels))
  except ValueError as e:
    return False, errors.first_line(e)
  return True, ''


def routing_summary(workdir: str,
                    names: Sequence[str] = tuple(n for n, _ in ROUTING_METRICS)
                    ) -> dict[str, float]:
  """`names` (default: ROUTING_METRICS') of the run's last train log interval,
  averaged over MoE layers.

  Read from WORKDIR/metrics.jsonl (names 'routing/LAYER/METRIC'); {} for a dense
  model, and no entry for a name the run did not log.
  """
  last = None
  with open(os.path.join(workdir, metrics_lib.METRICS_FILE)) as f:
    for line in f:
      record = json.loads(line)
      if record.get('split') == 'train' and any(k.startswith('routing/') for k in record):
        last = record
  out = {}
  for name in names:
    values = [v for k, v in (last or {}).items()
              if k.startswith('routing/') and k.rsplit('/', 1)[1] == name]
    if values:
      out[name] = float(np.mean(values))
  return out


def train_one(config, workdir: str) -> dict[str, float]:
  """Trains, then few-shot evaluates; top-1 and 10-shot in %, training wall seconds,
  GFLOPs per train step (None if XLA gave none) and the routing metrics of
  `routing_summary`."""
  start = time.perf_counter()
  summary = trainer.train_and_evaluate(config, workdir)
  wall = time.perf_counter() - start
  payload = checkpoint_fewshot.run(config, workdir)
  shot = payload['datasets']['digits']['shots']
  shot = shot.get(FEWSHOT_SHOTS, shot.get(str(FEWSHOT_SHOTS)))
  return {'top1': 100.0 * float(summary['eval']['accuracy']),
          'fewshot10': 100.0 * float(shot['accuracy_mean']),
          'train_wall_s': wall,
          'steps_per_sec': float(summary['steps_per_sec'])
                           if 'steps_per_sec' in summary else None,
          'gflops': summary['flops_per_step'] / 1e9 if 'flops_per_step' in summary else None,
          **routing_summary(workdir)}


def _stats(values: Sequence[float]) -> tuple[float, float]:
  values = np.asarray(values, np.float64)
  return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def summarize(runs: list[dict[str, Any]], routers: Sequence[str]) -> dict[str, dict]:
  """Per router: mean/std of top-1, 10-shot and time ratio to TopK of the same seed."""
  topk_wall = {r['seed']: r['train_wall_s'] for r in runs if r['router'] == 'topk'}
  out = {}
  for router in routers:
    rows = [r for r in runs if r['router'] == router]
    if not rows:
      continue
    ratios = [r['train_wall_s'] / topk_wall[r['seed']] for r in rows if r['seed'] in topk_wall]
    top1, top1_std = _stats([r['top1'] for r in rows])
    few, few_std = _stats([r['fewshot10'] for r in rows])
    wall, wall_std = _stats([r['train_wall_s'] for r in rows])
    routing = {}
    for name in (*(n for n, _ in ROUTING_METRICS), 'gflops'):
      values = [r[name] for r in rows if r.get(name) is not None]
      if values:
        routing[f'{name}_mean'], routing[f'{name}_std'] = _stats(values)
    out[router] = {
        **routing,
        'top1_mean': top1, 'top1_std': top1_std,
        'fewshot10_mean': few, 'fewshot10_std': few_std,
        'time_ratio_mean': _stats(ratios)[0] if ratios else None,
        'time_ratio_std': _stats(ratios)[1] if ratios else None,
        'train_wall_s_mean': wall, 'train_wall_s_std': wall_std,
        'seeds': [r['seed'] for r in rows],
    }
  return out


def marginal_step_time(results: dict[str, Any]) -> dict[str, dict[str, float]]:
  """Seconds per training step between the two budgets (compilation cancels out).

  (wall(long) - wall(short)) / (long - short) per router and seed, then its ratio
  to TopK's of the same seed; empty with fewer than two budgets.
  """
  if len(results) < 2:
    return {}
  (long_steps, long_res), (short_steps, short_res) = sorted(
      results.items(), key=lambda kv: -int(kv[0]))[:2]
  per_step = {}
  for r in long_res['runs']:
    short = [s for s in short_res['runs'] if s['router'] == r['router'] and s['seed'] == r['seed']]
    if short:
      per_step[(r['router'], r['seed'])] = ((r['train_wall_s'] - short[0]['train_wall_s'])
                                            / (int(long_steps) - int(short_steps)))
  out = {}
  for router in dict.fromkeys(k[0] for k in per_step):
    seeds = [s for (rt, s) in per_step if rt == router]
    ratios = [per_step[(router, s)] / per_step[('topk', s)] for s in seeds
              if ('topk', s) in per_step]
    out[router] = {'step_s_mean': _stats([per_step[(router, s)] for s in seeds])[0],
                   'ratio_mean': _stats(ratios)[0] if ratios else None,
                   'ratio_std': _stats(ratios)[1] if ratios else None}
  return out


def run(out_dir: str, *, quick: bool, seeds: int | None,
        routers: Sequence[str] | None = None, budgets: Sequence[int] | None = None) -> dict:
  """Trains every known router in `routers` at each budget; writes the figure.

  `routers` defaults to ROUTERS, or with `quick` to TopK and the paper's router
  (QUICK_ROUTERS; each router's training is tested on its own elsewhere).
  """
  routers = tuple(routers or (QUICK_ROUTERS if quick else ROUTERS))
  os.makedirs(out_dir, exist_ok=True)
  budgets = tuple(budgets or (QUICK_BUDGETS if quick else FULL_BUDGETS))
  num_seeds = seeds or (1 if quick else FULL_SEEDS)
  known, skipped = [], {}
  for router in routers:
    ok, why = router_available(make_config(router, budgets[0], 0, quick=quick))
    if ok:
      known.append(router)
    else:
      skipped[router] = why
      print(f'router_study: skipping router {router!r}: {why}')
  results: dict[str, Any] = {}
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix='router_study_') as tmp:
    for steps in budgets:
      runs = []
      for seed in range(num_seeds):
        for router in known:
          config = make_config(router, steps, seed, quick=quick)
          metrics = train_one(config, os.path.join(tmp, f'{steps}_{router}_{seed}'))
          runs.append({'router': router, 'seed': seed, **metrics})
          print(f'router_study: steps={steps} seed={seed} {router}: '
                f"top1={metrics['top1']:.2f} 10-shot={metrics['fewshot10']:.2f} "
                + (f"GFLOPs/step={metrics['gflops']:.3f} " if metrics.get('gflops') else '')
                + ''.join(f"{label}={metrics[name]:.3f} " for name, label in ROUTING_METRICS
                          if name in metrics)
                + f"train {metrics['train_wall_s']:.1f}s", flush=True)
      results[str(steps)] = {'routers': summarize(runs, known), 'runs': runs}
  payload = {
      'settings': {
          'config': 'configs/vmoe_tiny_mnist.py', 'budgets_steps': list(budgets),
          'seeds': num_seeds, 'quick': quick,
          'capacity_factor': None if quick else CAPACITY_FACTOR,
          'fewshot': f'digits {FEWSHOT_SHOTS}-shot, mean over few-shot draws '
                     f'{list(make_config(known[0], budgets[0], 0, quick=quick).fewshot.seeds)}'
                     if known else None,
          'upstream': 'embedded MNIST train (50k), test top-1 on MNIST test',
          'wall_s': time.perf_counter() - start,
      },
      'budgets': results,
      'marginal_step_time': marginal_step_time(results),
      'skipped': skipped,
      'paper': PAPER,
  }
  plot(payload, os.path.join(out_dir, f'{NAME}.png'))
  return payload


def plot(payload: dict, path: str) -> None:
  """Bars per router: top-1, 10-shot, balance and time ratio, one colour per budget;
  then top-1 against GFLOPs per train step, one point per (router, budget)."""
  budgets = payload['budgets']
  routers = list(next(iter(budgets.values()))['routers'])
  metrics = [('top1', 'MNIST test top-1 (%)'), ('fewshot10', 'digits 10-shot top-1 (%)'),
             ('max_load_violation', 'MaxVio (last interval)'),
             ('dropped_fraction', 'dropped tokens (last interval)'),
             ('time_ratio', 'training wall time / TopK (same seed)')]
  fig, axes = style.figure(1, len(metrics) + 1, width=21.6, height=3.8, squeeze=True)
  _plot_accuracy_against_flops(axes[-1], budgets, routers)
  axes = axes[:-1]
  width = 0.8 / len(budgets)
  x = np.arange(len(routers))
  for b, (steps, res) in enumerate(budgets.items()):
    for ax, (key, label) in zip(axes, metrics):
      means = [res['routers'][r].get(f'{key}_mean', np.nan) for r in routers]
      means = [np.nan if m is None else m for m in means]
      stds = [res['routers'][r].get(f'{key}_std') or 0.0 for r in routers]
      bars = ax.bar(x + (b - (len(budgets) - 1) / 2) * width, means, width, yerr=stds,
                    capsize=3, label=f'{steps} steps')
      ax.bar_label(bars, fmt='%.1f' if key in ('top1', 'fewshot10') else '%.2f', fontsize=7,
                   padding=2)
      ax.set_ylabel(label)
  for ax, (key, label) in zip(axes, metrics):
    ax.set_xticks(x, [ROUTER_LABELS.get(r, r) for r in routers], rotation=20, ha='right')
    ax.set_title(label)
    if key in ('top1', 'fewshot10'):
      lows = [res['routers'][r][f'{key}_mean'] for res in budgets.values() for r in routers]
      ax.set_ylim(max(0.0, min(lows) - 10.0), 100.0)
    elif key == 'time_ratio':
      ax.axhline(1.0, color='0.5', lw=0.8, ls='--')
  axes[-1].legend(loc='upper left')
  fig.suptitle(f"Routers on the tiny V-MoE (MNIST), mean ± std over "
               f"{payload['settings']['seeds']} seed(s)")
  style.save(fig, path)


def _plot_accuracy_against_flops(ax, budgets: dict, routers: list) -> None:
  for r, router in enumerate(routers):
    for b, (steps, res) in enumerate(budgets.items()):
      s = res['routers'][router]
      if s.get('gflops_mean') is None:
        continue
      ax.errorbar(s['gflops_mean'], s['top1_mean'], yerr=s['top1_std'], fmt='os^Dv'[b % 5],
                  color=f'C{r % 10}', capsize=3,
                  label=ROUTER_LABELS.get(router, router) if b == 0 else None)
  ax.set_xlabel('GFLOPs per train step (XLA, per device)')
  ax.set_ylabel('MNIST test top-1 (%)')
  ax.set_title('top-1 against compute')
  if ax.lines:
    ax.legend(fontsize=7)


def format_table(payload: dict) -> str:
  """One row per (budget, router), then the paper's B/32 and B/16 rows."""
  lines = [f"{'steps':>5}  {'router':<21} {'MNIST top-1':>14} {'digits 10-shot':>15} "
           + ''.join(f'{label:>15}' for _, label in ROUTING_METRICS) + f"{'GFLOPs/step':>12}"
           + f"{'time / TopK':>14}"]
  for steps, res in payload['budgets'].items():
    for router, s in res['routers'].items():
      ratio = ('n/a' if s['time_ratio_mean'] is None
               else f"{s['time_ratio_mean']:.2f} ± {s['time_ratio_std']:.2f}")
      routing = ''.join(f"{s[f'{name}_mean']:7.3f} ± {s[f'{name}_std']:5.3f}"
                        if f'{name}_mean' in s else f"{'n/a':>15}"
                        for name, _ in ROUTING_METRICS)
      gflops = 'n/a' if s.get('gflops_mean') is None else f"{s['gflops_mean']:.3f}"
      lines.append(f"{steps:>5}  {ROUTER_LABELS.get(router, router):<21} "
                   f"{s['top1_mean']:6.2f} ± {s['top1_std']:4.2f} "
                   f"{s['fewshot10_mean']:7.2f} ± {s['fewshot10_std']:4.2f} {routing}"
                   f"{gflops:>12}{ratio:>14}")
  for router, why in payload.get('skipped', {}).items():
    lines.append(f"       {router:<21} skipped: {why}")
  lines.append('paper (JFT-300M prec@1, ImageNet 10-shot, TPUv2-core-days / TopK):')
  for variant, rows in payload['paper'].items():
    for router, p in rows.items():
      ratio = p['tpu_core_days'] / rows['topk']['tpu_core_days']
      lines.append(f"{variant:>5}  {ROUTER_LABELS[router]:<21} {p['jft_prec1']:14.2f} "
                   f"{p['imagenet_10shot']:15.2f} {ratio:12.2f}")
  return '\n'.join(lines)
