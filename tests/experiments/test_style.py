"""experiments.style: nonzero counts and the plan panels."""
import matplotlib.pyplot as plt
import numpy as np

from vmoe_sparse_ot.experiments import style

T = np.array([[0.5, 0.0, 1e-9],
              [0.0, 0.25, 0.0]])


def test_nnz_counts_exact_or_relative_nonzeros():
  assert style.nnz(T) == 3
  assert style.nnz(T, rtol=1e-6) == 2
  assert style.nnz(np.zeros((2, 2)) + 1.0) == 4


def test_panels_title_their_nonzeros_and_draw_a_segment_each():
  fig, axes = style.figure(1, 3)
  style.plan_matrix(axes[0, 0], T, title='k = 2')
  assert axes[0, 0].get_title() == 'k = 2\n3 nonzeros'
  X, Y = np.array([[0.0, 0.0], [1.0, 0.0]]), np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]])
  style.matching(axes[0, 1], X, Y, T, rtol=1e-6)
  assert axes[0, 1].get_title() == '2 nonzeros' and len(axes[0, 1].lines) == 2
  style.plan_with_marginals(axes[0, 2], T, [0.5, 0.25], [0.5, 0.25, 0.0], title='plan')
  assert [inset.get_title() for inset in axes[0, 2].child_axes] == ['plan\n3 nonzeros', '']
  plt.close(fig)
