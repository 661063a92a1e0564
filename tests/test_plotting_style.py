"""plotting_style: figure sizes, distinct colours, PNG files."""
import matplotlib.pyplot as plt
import numpy as np
import pytest

from vmoe_sparse_ot import plotting_style


def test_figure_size_from_panels_or_given_and_the_axes_grid():
  fig, axes = plotting_style.figure(2, 3)
  assert axes.shape == (2, 3)
  np.testing.assert_allclose(fig.get_size_inches(), [3 * 2.6, 2 * 2.4])
  fig2, ax = plotting_style.figure(width=5, panel=(1.0, 1.5), squeeze=True, title='t')
  assert isinstance(ax, plt.Axes) and fig2.get_suptitle() == 't'
  np.testing.assert_allclose(fig2.get_size_inches(), [5, 1.5])
  assert plt.rcParams['font.size'] == plotting_style.RC['font.size']
  plt.close(fig)
  plt.close(fig2)


@pytest.mark.parametrize('n', [1, 9, 45, 60])
def test_categorical_colors_are_distinct_and_never_grey(n):
  colors = plotting_style.categorical_colors(n)
  assert colors.shape == (n, 4)
  assert len({tuple(c) for c in colors}) == n
  assert not any(r == g == b for r, g, b, _ in colors)


def test_save_writes_a_png_in_a_new_folder_and_closes_the_figure(tmp_path):
  fig, _ = plotting_style.figure()
  path = str(tmp_path / 'a' / 'b.png')
  assert plotting_style.save(fig, path) == path
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert fig.number not in plt.get_fignums()
