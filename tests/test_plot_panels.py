"""The training-curve panels draw every eval set the run logged."""
import os

import numpy as np

from vmoe_sparse_ot import plot


def _series(*values):
  return np.arange(len(values)), np.array(values, np.float64)


def test_extra_eval_sets_are_lines_of_the_loss_and_accuracy_panels(tmp_path):
  scalars = {
      'loss': _series(2.0, 1.0), 'accuracy': _series(0.3, 0.6),
      'eval/loss': _series(1.5), 'eval/accuracy': _series(0.5),
      'eval/num_examples': _series(100),
      'eval/real/loss': _series(1.4), 'eval/real/accuracy': _series(0.55),
      'eval/real/num_examples': _series(50),
      'eval/v2/accuracy': _series(0.4),
      'moe/layer_1/max_violation': _series(0.2),
  }
  assert plot.eval_set_names(scalars) == ['real', 'v2']
  panels = {title: [label for tag, label in lines if tag in scalars]
            for title, lines, _ in plot.curve_panels(scalars)}
  assert panels == {'Loss': ['train (interval mean)', 'eval', 'eval real'],
                    'Top-1 accuracy': ['train', 'eval', 'eval real', 'eval v2']}
  path = plot.plot_curves(scalars, str(tmp_path / 'curves.png'))
  assert path and os.path.getsize(path) > 0


def test_a_run_without_extra_sets_keeps_its_panels():
  scalars = {'loss': _series(1.0), 'learning_rate': _series(0.1)}
  assert plot.eval_set_names(scalars) == []
  assert [title for title, _, _ in plot.curve_panels(scalars)] == ['Loss', 'Learning rate']
