"""The one matplotlib style of every figure the project draws (Agg backend, no display).

    fig, axes = plotting_style.figure(2, 3, width=9, height=5)   # 2 rows, 3 columns
    fig, axes = plotting_style.figure(1, 4, panel=(4.2, 3.2))     # each panel 4.2 x 3.2 in
    plotting_style.save(fig, 'out/NAME.png')

`python -m vmoe_sparse_ot.plot` and the paper's experiments (`experiments.style`,
which adds the OT-specific panels) both draw with it.
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use('Agg')  # Files only; no display.
import matplotlib.pyplot as plt  # noqa: E402  pylint: disable=wrong-import-position
import numpy as np  # noqa: E402  pylint: disable=wrong-import-position

DPI = 110

RC = {
    'font.size': 9,
    'axes.titlesize': 9,
    'axes.labelsize': 9,
    'legend.fontsize': 8,
    'xtick.labelsize': 8,
    'ytick.labelsize': 8,
    'figure.titlesize': 11,
    'axes.spines.top': False,
    'axes.spines.right': False,
    'axes.grid': False,
    'grid.alpha': 0.3,
    'lines.linewidth': 1.5,
    'image.cmap': 'viridis',
    'savefig.bbox': 'tight',
    'savefig.pad_inches': 0.05,
}

# Tableau colors, in the order lines take them.
CYCLE = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7',
         '#9c755f', '#bab0ac']


def figure(nrows: int = 1, ncols: int = 1, *, width: float | None = None,
           height: float | None = None, panel: tuple[float, float] = (2.6, 2.4),
           title: str | None = None, squeeze: bool = False, **kwargs):
  """A figure and an (nrows, ncols) array of axes (or one Axes with squeeze=True).

  Size: `width` x `height` inches, each defaulting to `panel` (width, height of one
  panel) times the columns / rows. The style is set globally (plots are drawn
  after the axes are made, so a temporary context would miss line widths).
  """
  plt.rcParams.update(RC)
  plt.rcParams['axes.prop_cycle'] = matplotlib.cycler(color=CYCLE)
  width = width or panel[0] * ncols
  height = height or panel[1] * nrows
  fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=squeeze,
                           layout='constrained', **kwargs)
  if title:
    fig.suptitle(title)
  return fig, axes


def categorical_colors(n: int) -> np.ndarray:
  """`n` distinct RGBA colours without grey (grey and black mean "none" in figures)."""
  base = [plt.get_cmap('tab10')(i) for i in range(10) if i != 7]
  base += [plt.get_cmap('tab20b')(i) for i in range(20)]
  base += [plt.get_cmap('tab20c')(i) for i in range(16)]
  if n > len(base):
    base += [plt.get_cmap('hsv')(i / (n - len(base))) for i in range(n - len(base))]
  return np.array(base[:n])


def save(fig, path: str, dpi: int = DPI) -> str:
  """Writes `fig` as PNG at `path` (creating its folder), closes it, returns the path."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, format='png', dpi=dpi)
  plt.close(fig)
  return path
