"""One matplotlib style for the project's figures: Agg backend, readable on a laptop."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use('Agg')  # Files only; no display.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

STYLE = {
    'figure.dpi': 100,
    'savefig.dpi': 110,
    'font.size': 10,
    'axes.titlesize': 11,
    'axes.labelsize': 10,
    'axes.spines.top': False,
    'axes.spines.right': False,
    'axes.grid': True,
    'grid.alpha': 0.3,
    'legend.frameon': False,
    'legend.fontsize': 9,
    'lines.linewidth': 1.6,
}


def figure(ncols: int = 1, nrows: int = 1, *, width: float = 4.2, height: float = 3.2,
           **kwargs):
  """`plt.subplots` in the project style; each panel `width` x `height` inches.

  The style is set globally (plots are drawn after the axes are made, so a
  temporary context would miss line widths and the like).
  """
  plt.rcParams.update(STYLE)
  kwargs.setdefault('layout', 'constrained')  # Room for titles, labels and suptitles.
  return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                      **kwargs)


def categorical_colors(n: int):
  """`n` distinct RGBA colours without grey (grey and black mean "none" in figures)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  base = [plt.get_cmap('tab10')(i) for i in range(10) if i != 7]
  base += [plt.get_cmap('tab20b')(i) for i in range(20)]
  base += [plt.get_cmap('tab20c')(i) for i in range(16)]
  if n > len(base):
    base += [plt.get_cmap('hsv')(i / (n - len(base))) for i in range(n - len(base))]
  return np.array(base[:n])


def save(fig, path: str) -> str:
  """Writes `fig` as PNG at `path` (creating its folder), closes it, returns the path."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, format='png', bbox_inches='tight')
  plt.close(fig)
  return path
