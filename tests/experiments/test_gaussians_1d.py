"""gaussians_1d --quick: plans of each formulation between 1D histograms."""
import numpy as np
import pytest

from tests.experiments.conftest import pngs, quick_run
from vmoe_sparse_ot.experiments import gaussians_1d

NAME = 'gaussians_1d'


@pytest.fixture(scope='module')
def payload(out_dir, all_dir):
  return quick_run(NAME, out_dir, all_dir)


def test_files_and_keys(payload, out_dir):
  assert pngs(out_dir, NAME) == [f'{NAME}_bigaussian.png', f'{NAME}_gaussian.png']
  assert set(payload['cases']) == {'gaussian', 'bigaussian'}
  for ps in payload['cases'].values():
    assert set(ps) == {'unregularized', 'entropic', 'squared_l2', 'sparsity_constrained'}


def test_plan_properties(payload):
  n = gaussians_1d.GRID
  for ps in payload['cases'].values():
    assert ps['entropic']['nonzeros'] == n * n and ps['entropic']['min_entry'] > 0
    assert ps['sparsity_constrained']['max_nonzeros_per_column'] <= payload['k']
    assert ps['unregularized']['nonzeros'] <= 2 * n - 1
    # The squared 2-norm plan is sparse but not column-wise k-sparse.
    assert ps['squared_l2']['nonzeros'] < n * n
    assert ps['squared_l2']['max_nonzeros_per_column'] > payload['k']
    for key in ('unregularized', 'entropic', 'squared_l2'):
      assert ps[key]['max_row_marginal_error'] < 1e-6
    # Semi-dual plans meet the column marginals exactly.
    assert ps['sparsity_constrained']['max_column_marginal_error'] < 1e-12


def test_problem_by_hand():
  a, b, C = gaussians_1d.problem('gaussian')
  assert a.sum() == pytest.approx(1) and b.sum() == pytest.approx(1)
  assert np.argmax(a) == 10 and np.argmax(b) == 16
  assert C[0, 31] == pytest.approx(1.0) and C[3, 5] == pytest.approx(4 / 31 ** 2)
  _, b2, _ = gaussians_1d.problem('bigaussian')
  assert b2[8] == pytest.approx(b2[24]) and b2[16] < b2[8]
  np.testing.assert_allclose(C, C.T)
  with pytest.raises(ValueError, match='case must be one of'):
    gaussians_1d.problem('trigaussian')
