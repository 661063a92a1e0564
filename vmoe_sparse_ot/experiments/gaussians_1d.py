"""Appendix figures "OT between two Gaussian distributions" and "... Gaussian and
bi-Gaussian distributions": each formulation's plan on a 1D grid.

Source and target live on the grid {0, ..., 31}; with phi(z; mu, s) =
exp(-(z - mu)^2 / (2 s^2)) normalised to sum to 1:
  gaussian:   a = phi(.; 10, 4), b = phi(.; 16, 5);
  bigaussian: a = phi(.; 16, 5), b = phi(.; 8, 5) + phi(.; 24, 5).
Cost C_ij = (i - j)^2 / 31^2 in [0, 1]. Plans: unregularized (POT `ot.emd`),
entropic (the project's Sinkhorn, epsilon = 0.01), squared 2-norm (gamma = 1)
and sparsity-constrained with k = 2 (gamma = 1; semi-dual, L-BFGS), so at most
two nonzeros per column. Figures: `gaussians_1d_gaussian.png`,
`gaussians_1d_bigaussian.png`.
"""
import os

import jax
import numpy as np

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.experiments import common, style

NAME = 'gaussians_1d'
GRID = 32
GAMMA = 1.0
EPSILON = 0.01
K = 2
CASES = ('gaussian', 'bigaussian')
TITLES = {'gaussian': 'OT between two Gaussians: $\\phi(\\cdot; 10, 4)$ to $\\phi(\\cdot; 16, 5)$',
          'bigaussian': 'OT between a Gaussian and a bi-Gaussian: $\\phi(\\cdot; 16, 5)$ to '
                        '$\\phi(\\cdot; 8, 5) + \\phi(\\cdot; 24, 5)$'}


def _phi(z, mu, s):
  return np.exp(-(z - mu) ** 2 / (2.0 * s ** 2))


def problem(case: str = 'bigaussian'):
  """(a (32,), b (32,), C (32, 32)) of one appendix figure, float64."""
  z = np.arange(GRID, dtype=np.float64)
  if case == 'gaussian':
    a, b = _phi(z, 10, 4), _phi(z, 16, 5)
  elif case == 'bigaussian':
    a, b = _phi(z, 16, 5), _phi(z, 8, 5) + _phi(z, 24, 5)
  else:
    raise ValueError(f'case must be one of {CASES}, got {case!r}')
  C = (z[:, None] - z[None, :]) ** 2 / (GRID - 1) ** 2
  return a / a.sum(), b / b.sum(), C


def plans(a, b, C) -> dict:
  """Plan of each formulation: {key: (label, T (m, n))}."""
  with common.quiet_stdout():
    T0 = common.pot().emd(a, b, C)
  out = {'unregularized': ('Unregularized', np.asarray(T0))}
  with jax.enable_x64(True):
    out['entropic'] = (f'Entropic (ε={EPSILON:g})',
                       np.asarray(common.sinkhorn_plan(a, b, C, EPSILON).plan))
    out['squared_l2'] = (f'Squared 2-norm (γ={GAMMA:g})',
                         np.asarray(common.solve_plan(a, b, C, ot.SquaredL2(GAMMA)).plan))
    out['sparsity_constrained'] = (
        f'Sparsity-constrained (k={K}, γ={GAMMA:g})',
        np.asarray(common.solve_plan(a, b, C, ot.SparsityConstrained(k=K, gamma=GAMMA)).plan))
  return out


def run(out_dir: str, *, quick: bool, seeds: int | None) -> dict:
  del quick, seeds  # deterministic, and seconds at full size
  payload = {'gamma': GAMMA, 'epsilon': EPSILON, 'k': K, 'grid': GRID, 'figures': [],
             'cases': {}}
  for case in CASES:
    a, b, C = problem(case)
    ps = plans(a, b, C)
    fig, axes = style.figure(1, len(ps), width=2.75 * len(ps), height=3.4, title=TITLES[case])
    for ax, (label, T) in zip(axes[0], ps.values()):
      style.plan_with_marginals(ax, T, a, b, title=label)
    axes[0, 0].set_xlabel('target j')
    axes[0, 0].set_ylabel('source i', labelpad=40)
    path = style.save(fig, os.path.join(out_dir, f'{NAME}_{case}.png'))
    payload['figures'].append(path)
    payload['cases'][case] = {
        key: {'nonzeros': style.nnz(T), 'max_nonzeros_per_column': common.max_col_nnz(T),
              'min_entry': float(T.min()), 'transport_cost': float(np.sum(T * C)),
              'max_column_marginal_error': float(np.abs(T.sum(0) - b).max()),
              'max_row_marginal_error': float(np.abs(T.sum(1) - a).max())}
        for key, (_, T) in ps.items()}
  return payload


def format_table(payload: dict) -> str:
  rows = [('case', 'plan', 'nonzeros', 'max per column', '<T, C>', 'row marg. err')]
  for case, ps in payload['cases'].items():
    for key, p in ps.items():
      rows.append((case, key, p['nonzeros'], p['max_nonzeros_per_column'],
                   f"{p['transport_cost']:.3e}", f"{p['max_row_marginal_error']:.1e}"))
  return common.format_rows(rows, title=f"{NAME}: {payload['grid']}-point grid, k = "
                            f"{payload['k']}, gamma = {payload['gamma']}, epsilon = "
                            f"{payload['epsilon']}")
