"""Paper Figure "Solver comparison": L-BFGS and Adam on the dual and the semi-dual.

Sparsity-constrained OT with k = 2 on the three datasets of the figure (columns):
the 2D point clouds of `formulations_2d` (gamma = 1), the Gaussian to
bi-Gaussian problem of `gaussians_1d` (gamma = 1) and the china -> flower color
histograms of `color_transfer` (gamma = 0.1). Each solver runs a fixed budget of
iterations (tol = 0) from zero potentials and records the objective after every
iteration (`ot.solve(..., trace=True)`). Top row: objective against iterations;
bottom row: against wall-clock time, which is the whole solve's time (after a
warm-up run that compiles it; best of REPEATS runs) spread over its objective
evaluations in proportion (L-BFGS's line-search trials included).

--quick: the 2D column only, 300 iterations, one timed run, Adam at lr 1e-2.

Adam's learning rate is chosen per dataset and formulation as the one of
LEARNING_RATES with the best final objective (the paper tunes it too); L-BFGS
keeps `HISTORY` pairs. The dual and semi-dual have the same optimal value (paper
Proposition 3 (biconjugates)); the JSON reports both final values and their relative
difference.

Timings were taken on a shared 2-core CPU (see docs/PAPER.md for the load).
"""
import os
import time

import jax
import numpy as np

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.experiments import color_transfer, common, formulations_2d, gaussians_1d, style

NAME = 'solver_comparison'
K = 2
HISTORY = 30
REPEATS = {False: 3, True: 1}
MAX_ITER = {False: 3000, True: 300}
LEARNING_RATES = {False: (1e-3, 1e-2, 1e-1), True: (1e-2,)}
FORMULATIONS = ('semi_dual', 'dual')
SOLVERS = ('lbfgs', 'adam')
STYLES = {('lbfgs', 'semi_dual'): dict(color='#4e79a7', ls='-'),
          ('lbfgs', 'dual'): dict(color='#4e79a7', ls='--'),
          ('adam', 'semi_dual'): dict(color='#e15759', ls='-'),
          ('adam', 'dual'): dict(color='#e15759', ls='--')}
LABELS = {'lbfgs': 'L-BFGS', 'adam': 'Adam', 'semi_dual': 'semi-dual', 'dual': 'dual'}


DATASETS = ('2d_points', 'gaussian_bigaussian', 'color_transfer')
QUICK_DATASETS = ('2d_points',)  # --quick: one column, to stay within the tests' budget


def datasets(names=DATASETS) -> dict:
  """{name: (title, a (m,), b (n,), C (m, n), gamma)} of the figure's columns."""
  out = {}
  for name in names:
    if name == '2d_points':
      _, _, a, b, C = formulations_2d.problem(0)
      gamma, title = formulations_2d.GAMMA, '2D points'
    elif name == 'gaussian_bigaussian':
      (a, b, C), gamma = gaussians_1d.problem('bigaussian'), gaussians_1d.GAMMA
      title = 'Gaussian → bi-Gaussian'
    elif name == 'color_transfer':
      (a, b, C), gamma = color_transfer.problem(False), color_transfer.GAMMA
      title = 'Color transfer'
    else:
      raise ValueError(f'dataset must be one of {DATASETS}, got {name!r}')
    out[name] = (f'{title} ({len(a)} x {len(b)}), γ={gamma:g}', a, b, C, gamma)
  return out


def traced_solve(a, b, C, reg, *, formulation: str, solver: str, max_iter: int,
                 learning_rate: float = 1e-2, repeats: int = 3, **kwargs):
  """Solves with trace=True; returns (result, seconds of the best of `repeats` warm runs).

  repeats=0: no timing (seconds is NaN).
  """
  # From zero potentials, both formulations (the semi-dual's default start is
  # `ot.c_transform_start`): the figure compares solvers from one point.
  kwargs.setdefault('init', (np.zeros(len(a)), np.zeros(len(b))))

  options = (ot.Adam(learning_rate=learning_rate) if solver == 'adam'
             else ot.LBFGS(history=HISTORY))

  def go():
    return ot.solve(a, b, C, reg, formulation=formulation, solver=options, max_iter=max_iter,
                    tol=0.0, trace=True, **kwargs)
  res = jax.block_until_ready(go())  # compiles
  seconds = min((common.timed(go)[1] for _ in range(repeats)), default=float('nan'))
  return res, seconds


def curve(res, seconds: float) -> dict:
  """Per-iteration value, gradient norm and time (s) of a traced result (NaN-free prefix)."""
  num = int(res.num_iter)
  evals = np.asarray(res.trace.num_evals)[:num].astype(np.float64)
  return {'value': np.asarray(res.trace.value)[:num],
          'grad_norm': np.asarray(res.trace.grad_norm)[:num],
          'time_s': seconds * evals / float(res.num_evals),
          'num_iter': num, 'num_evals': int(res.num_evals), 'seconds': seconds,
          'final_value': float(res.value)}


def run(out_dir: str, *, quick: bool, seeds: int | None) -> dict:
  del seeds  # deterministic
  max_iter = MAX_ITER[quick]
  data = datasets(QUICK_DATASETS if quick else DATASETS)
  repeats = REPEATS[quick]
  results = {}
  with jax.enable_x64(True):
    for name, (_, a, b, C, gamma) in data.items():
      reg = ot.SparsityConstrained(k=K, gamma=gamma)
      for formulation in FORMULATIONS:
        res, sec = traced_solve(a, b, C, reg, formulation=formulation, solver='lbfgs',
                                max_iter=max_iter, repeats=repeats)
        results[(name, 'lbfgs', formulation)] = dict(curve(res, sec), learning_rate=None)
        best = None
        for lr in LEARNING_RATES[quick]:
          res, sec = traced_solve(a, b, C, reg, formulation=formulation, solver='adam',
                                  max_iter=max_iter, learning_rate=lr, repeats=repeats)
          c = dict(curve(res, sec), learning_rate=lr)
          if best is None or c['final_value'] > best['final_value']:
            best = c
        results[(name, 'adam', formulation)] = best

  fig, axes = style.figure(2, len(data), width=max(3.6 * len(data), 6.5), height=5.4,
                           title=f'Solver comparison, sparsity-constrained OT (k = {K})')
  summary = {}
  for col, (name, (title, *_)) in enumerate(data.items()):
    finals = [results[(name, s, f)]['final_value'] for s in SOLVERS for f in FORMULATIONS]
    top = max(np.nanmax(results[(name, s, f)]['value']) for s in SOLVERS for f in FORMULATIONS)
    span = 0.01 * abs(top)
    for solver in SOLVERS:
      for formulation in FORMULATIONS:
        r = results[(name, solver, formulation)]
        label = f'{LABELS[solver]}, {LABELS[formulation]}'
        if r['learning_rate'] is not None:
          label += f" (lr {r['learning_rate']:g})"
        iters = np.arange(1, r['num_iter'] + 1)
        axes[0, col].plot(iters, r['value'], label=label, **STYLES[(solver, formulation)])
        axes[1, col].plot(r['time_s'] * 1e3, r['value'], label=label,
                          **STYLES[(solver, formulation)])
    for row in range(2):
      axes[row, col].set_ylim(top - span, top + 0.1 * span)
      axes[row, col].set_ylabel('objective (maximised)')
      axes[row, col].grid(True)
      axes[row, col].set_xscale('log')
    axes[0, col].set_title(title)
    axes[0, col].set_xlabel('iteration')
    axes[1, col].set_xlabel('wall-clock time (ms)')
    axes[0, col].legend(loc='lower left', frameon=False)
    lb = {f: results[(name, 'lbfgs', f)]['final_value'] for f in FORMULATIONS}
    best = {f: max(results[(name, s, f)]['final_value'] for s in SOLVERS) for f in FORMULATIONS}
    summary[name] = {
        'size': list(data[name][3].shape), 'gamma': data[name][4],
        'runs': {f'{s}_{f}': {key: results[(name, s, f)][key] for key in
                              ('final_value', 'num_iter', 'num_evals', 'seconds',
                               'learning_rate')}
                 for s in SOLVERS for f in FORMULATIONS},
        'lbfgs_dual_vs_semi_dual_rel_diff': abs(lb['dual'] - lb['semi_dual']) / abs(
            lb['semi_dual']),
        'best_dual_vs_semi_dual_rel_diff': abs(best['dual'] - best['semi_dual']) / abs(
            best['semi_dual']),
        'best_final_value': max(finals),
        'curves': {f'{s}_{f}': {'value': results[(name, s, f)]['value'],
                                'time_s': results[(name, s, f)]['time_s']}
                   for s in SOLVERS for f in FORMULATIONS},
    }
  fig.text(0.5, -0.01, 'Solid: semi-dual, dashed: dual. Time: each warm solve (best of '
           f'{repeats}) spread over its objective evaluations. y-axis: the 1% below the '
           'best value reached.', ha='center', fontsize=8, color='0.3')
  path = style.save(fig, os.path.join(out_dir, f'{NAME}.png'))
  return {'figure': path, 'k': K, 'max_iter': max_iter, 'lbfgs_history': HISTORY,
          'adam_learning_rates': list(LEARNING_RATES[quick]), 'datasets': summary,
          'timing_note': f'shared 2-core CPU; best of {repeats} warm runs',
          'started_utc': time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}


def format_table(payload: dict) -> str:
  rows = [('dataset', 'solver', 'final value', 'iters', 'time (ms)', 'lr')]
  tail = []
  for name, d in payload['datasets'].items():
    for key, r in d['runs'].items():
      rows.append((name, key, f"{r['final_value']:.8f}", r['num_iter'],
                   f"{1e3 * r['seconds']:.1f}",
                   '' if r['learning_rate'] is None else f"{r['learning_rate']:g}"))
    tail.append(f"{name}: |dual - semi-dual| / |semi-dual| = "
                f"{d['lbfgs_dual_vs_semi_dual_rel_diff']:.2e} (L-BFGS), "
                f"{d['best_dual_vs_semi_dual_rel_diff']:.2e} (best of both solvers)")
  return common.format_rows(rows, title=f"{NAME}: k = {payload['k']}, {payload['max_iter']} "
                            'iterations') + '\n' + '\n'.join(tail)
