"""The experiments' figures: the project's style (`plotting_style`) and OT panels.

    fig, axes = style.figure(2, 3, width=9, height=5)
    style.plan_matrix(axes[1, 0], T, title='k = 2')
    style.matching(axes[0, 0], X, Y, T)
    style.save(fig, os.path.join(out_dir, 'NAME.png'))

Colors: `COLORS[name]` for the formulations shared by several figures, so a
method has one color everywhere.
"""
import numpy as np

from vmoe_sparse_ot.plotting_style import CYCLE  # noqa: F401  (re-exported)
from vmoe_sparse_ot.plotting_style import DPI  # noqa: F401
from vmoe_sparse_ot.plotting_style import RC  # noqa: F401
from vmoe_sparse_ot.plotting_style import figure  # noqa: F401
from vmoe_sparse_ot.plotting_style import save  # noqa: F401

# One color per formulation / solver, the same in every figure.
COLORS = {
    'unregularized': '#4e79a7',
    'entropic': '#f28e2b',
    'squared_l2': '#59a14f',
    'sparsity_constrained': '#e15759',
    'source': '#4e79a7',
    'target': '#e15759',
}
PLAN_CMAP = 'Blues'


def nnz(T, rtol: float = 0.0) -> int:
  """Nonzeros of a plan: entries above rtol * max |T| (default: exact nonzeros).

  The sparse solvers' plans have exact zeros (projections clip at 0), and an
  entropic plan is dense in exact arithmetic, so counting T != 0 is the paper's
  count; pass rtol > 0 to ignore round-off-sized entries.
  """
  T = np.asarray(T)
  return int(np.sum(np.abs(T) > rtol * np.abs(T).max()))


def plan_matrix(ax, T, *, title: str | None = None, show_nnz: bool = True, cmap=PLAN_CMAP,
                rtol: float = 0.0, xlabel: str = 'target j', ylabel: str = 'source i'):
  """Draws plan T (m, n) as an image, zeros white; the title gains its nonzero count."""
  T = np.asarray(T, dtype=np.float64)
  masked = np.ma.masked_where(np.abs(T) <= rtol * np.abs(T).max(), T)  # zeros white
  ax.imshow(masked, cmap=cmap, interpolation='nearest', aspect='auto', vmin=0)
  ax.set_facecolor('white')
  ax.set_xticks([])
  ax.set_yticks([])
  for side in ('top', 'right'):
    ax.spines[side].set_visible(True)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  label = title or ''
  if show_nnz:
    label = f'{label}\n{nnz(T, rtol)} nonzeros' if label else f'{nnz(T, rtol)} nonzeros'
  if label:
    ax.set_title(label)


def matching(ax, X, Y, T, *, title: str | None = None, show_nnz: bool = True,
             rtol: float = 0.0, max_width: float = 1.4, color: str = '#2b5d9b'):
  """Source points X (m, 2), target points Y (n, 2) and a segment per nonzero T_ij.

  Segment width and opacity grow with T_ij / max T.
  """
  X, Y, T = np.asarray(X), np.asarray(Y), np.asarray(T, dtype=np.float64)
  tmax = np.abs(T).max()
  segs = np.argwhere(np.abs(T) > rtol * tmax)
  # Faint segments first, so the heavy ones draw on top.
  order = np.argsort(T[segs[:, 0], segs[:, 1]])
  for i, j in segs[order]:
    w = T[i, j] / tmax
    ax.plot([X[i, 0], Y[j, 0]], [X[i, 1], Y[j, 1]], color=color, lw=0.2 + max_width * w,
            alpha=0.08 + 0.72 * w, zorder=1, solid_capstyle='round')
  ax.scatter(X[:, 0], X[:, 1], s=14, c=COLORS['source'], zorder=2, label='source',
             edgecolors='white', linewidths=0.4)
  ax.scatter(Y[:, 0], Y[:, 1], s=14, c=COLORS['target'], zorder=2, label='target',
             edgecolors='white', linewidths=0.4)
  ax.set_aspect('equal', adjustable='datalim')
  ax.set_xticks([])
  ax.set_yticks([])
  label = title or ''
  if show_nnz:
    n = len(segs)
    label = f'{label}\n{n} nonzeros' if label else f'{n} nonzeros'
  if label:
    ax.set_title(label)


def plan_with_marginals(ax, T, a, b, *, title: str | None = None, color: str = '0.3'):
  """`plan_matrix` of T (m, n) with the row marginal a drawn left and b on top."""
  plan_matrix(ax, T, title=None)
  m, n = np.shape(T)
  top = ax.inset_axes([0.0, 1.02, 1.0, 0.22])
  top.fill_between(np.arange(n), np.asarray(b), color=COLORS['target'], alpha=0.7, step='mid')
  top.set_xlim(-0.5, n - 0.5)
  top.set_ylim(0, None)
  top.axis('off')
  left = ax.inset_axes([-0.24, 0.0, 0.22, 1.0])
  left.fill_betweenx(np.arange(m), -np.asarray(a), color=COLORS['source'], alpha=0.7,
                     step='mid')
  left.set_ylim(m - 0.5, -0.5)  # imshow's row order
  left.set_xlim(None, 0)
  left.axis('off')
  ax.set_ylabel('')
  ax.set_xlabel('')
  label = f'{title}\n{nnz(T)} nonzeros' if title else f'{nnz(T)} nonzeros'
  top.set_title(label, color=color)
