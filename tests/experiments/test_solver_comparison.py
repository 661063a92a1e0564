"""solver_comparison --quick: traces of L-BFGS / Adam on the dual and semi-dual."""
import numpy as np
import pytest

from tests.experiments.conftest import pngs, quick_run

NAME = 'solver_comparison'


@pytest.fixture(scope='module')
def payload(out_dir, all_dir):
  return quick_run(NAME, out_dir, all_dir)


def test_files_and_keys(payload, out_dir):
  assert pngs(out_dir, NAME) == [f'{NAME}.png']
  assert payload['k'] == 2
  for d in payload['datasets'].values():
    assert set(d['runs']) == {'lbfgs_semi_dual', 'lbfgs_dual', 'adam_semi_dual', 'adam_dual'}
    for key in ('lbfgs_dual_vs_semi_dual_rel_diff', 'best_final_value', 'curves'):
      assert key in d


def test_final_dual_and_semi_dual_values_agree(payload):
  """Proposition 3 (biconjugates): the dual and the semi-dual share their optimal value."""
  for d in payload['datasets'].values():
    r = d['runs']
    assert r['lbfgs_dual']['final_value'] == pytest.approx(r['lbfgs_semi_dual']['final_value'],
                                                           rel=1e-6)
    assert d['lbfgs_dual_vs_semi_dual_rel_diff'] < 1e-6


def test_curves(payload):
  for d in payload['datasets'].values():
    for key, c in d['curves'].items():
      value, t = np.array(c['value'], float), np.array(c['time_s'], float)
      assert np.all(np.isfinite(value)) and len(value) == d['runs'][key]['num_iter']
      assert np.all(np.diff(t) >= 0) and t[-1] == pytest.approx(d['runs'][key]['seconds'],
                                                                 rel=0.05)
      if key.startswith('lbfgs'):  # Armijo line search: monotone ascent
        assert np.all(np.diff(value) >= -1e-12)
      # Both objectives are concave: no iterate beats the best final value by much.
      assert value.max() <= d['best_final_value'] * (1 + 1e-6)
