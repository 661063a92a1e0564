"""Paper Figure "Increasing k increases smoothness": Omega*_+(s) against k.

s = (s1, s2, 0, 1) with (s1, s2) on a square grid; Omega*_+ is the conjugate of
the sparsity-constrained regularizer over the non-negative orthant (paper eq.
"l2ind_topk", Table 1): 1/(2 gamma) sum_{i <= k} [s_[i]]_+^2, computed with the
library's `SparsityConstrained(k, gamma).conj_plus` for k = 1..4 (gamma = 1).
k = 4 = m is the squared 2-norm conjugate.

Smoothness is measured on the grid as the largest absolute second difference
(along s1, along s2 and mixed, divided by h^2): it stays bounded by 1/gamma where
Omega*_+ is differentiable with a 1/gamma-Lipschitz gradient, and grows like
1/h across a kink. For this s, k = 3 and k = 4 coincide (the dropped smallest
coordinate only ever contributes [.]_+ = 0).
"""
import os

import jax
import jax.numpy as jnp
import numpy as np

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.experiments import common, style

NAME = 'smoothness_vs_k'
KS = (1, 2, 3, 4)
GAMMA = 1.0
LIMIT = 2.0  # grid over [-LIMIT, LIMIT]^2


def conj_plus_grid(k: int, s1, s2, gamma: float = GAMMA) -> np.ndarray:
  """Omega*_+((s1, s2, 0, 1)) for each grid point; s1, s2 (P, Q) -> (P, Q)."""
  return np.asarray(_conj_plus_grid(ot.SparsityConstrained(k=k, gamma=gamma), s1, s2))


@jax.jit  # One program, not one per operation (61 x 61 grid, k = 1..4: 3.6 s -> 0.6 s).
def _conj_plus_grid(reg, s1, s2):
  s = jnp.stack([s1, s2, jnp.zeros_like(s1), jnp.ones_like(s1)], axis=0)  # (4, P, Q)
  return reg.conj_plus(s, axis=0)[0]


def max_second_difference(F: np.ndarray, h: float) -> float:
  """Largest |second difference| / h^2 of F (P, Q): along each axis and mixed."""
  d11 = np.abs(F[2:, :] - 2 * F[1:-1, :] + F[:-2, :])
  d22 = np.abs(F[:, 2:] - 2 * F[:, 1:-1] + F[:, :-2])
  d12 = np.abs(F[1:, 1:] - F[1:, :-1] - F[:-1, 1:] + F[:-1, :-1])
  return float(max(d11.max(), d22.max(), d12.max()) / h ** 2)


def run(out_dir: str, *, quick: bool, seeds: int | None) -> dict:
  del seeds  # deterministic
  num = 61 if quick else 201
  grid = np.linspace(-LIMIT, LIMIT, num)
  h = float(grid[1] - grid[0])
  s1, s2 = np.meshgrid(grid, grid, indexing='ij')
  with jax.enable_x64(True):
    values = {k: conj_plus_grid(k, jnp.asarray(s1), jnp.asarray(s2)) for k in KS}
  curvature = {k: max_second_difference(values[k], h) for k in KS}

  fig, axes = style.figure(1, len(KS), width=2.9 * len(KS), height=3.3,
                           subplot_kw={'projection': '3d'})
  zmax = max(v.max() for v in values.values())
  for idx, k in enumerate(KS):
    ax = axes[0, idx]
    ax.plot_surface(s1, s2, values[k], cmap='viridis', rstride=max(1, num // 40),
                    cstride=max(1, num // 40), linewidth=0, antialiased=True, vmin=0,
                    vmax=zmax)
    ax.set_zlim(0, zmax)
    ax.set_xlabel('$s_1$', labelpad=-6)
    ax.set_ylabel('$s_2$', labelpad=-6)
    ax.zaxis.set_rotate_label(False)
    ax.set_zlabel('$\\Omega^*_+(s)$', labelpad=-2, rotation=90)
    ax.tick_params(pad=-3)
    ax.view_init(elev=28, azim=-130)
    suffix = ' (= squared 2-norm)' if k == 4 else ''
    ax.set_title(f'k = {k}{suffix}\nmax 2nd difference {curvature[k]:.3g}')
  fig.suptitle('Increasing k increases smoothness: $\\Omega^*_+(s)$, '
                   f'$s = (s_1, s_2, 0, 1)$, $\\gamma$ = {GAMMA:g}')
  path = style.save(fig, os.path.join(out_dir, f'{NAME}.png'))
  return {
      'figure': path,
      'gamma': GAMMA,
      'grid': {'min': -LIMIT, 'max': LIMIT, 'points': num, 'step': h},
      'ks': list(KS),
      'max_second_difference': {str(k): curvature[k] for k in KS},
      'max_value': {str(k): float(values[k].max()) for k in KS},
  }


def format_table(payload: dict) -> str:
  rows = [('k', 'max |2nd difference| / h^2', 'max value')]
  for k in payload['ks']:
    rows.append((k, f"{payload['max_second_difference'][str(k)]:.4g}",
                 f"{payload['max_value'][str(k)]:.4g}"))
  g = payload['grid']
  return common.format_rows(
      rows, title=f"{NAME}: Omega*_+((s1, s2, 0, 1)), gamma = {payload['gamma']}, "
      f"{g['points']}^2 grid on [{g['min']}, {g['max']}]^2")
