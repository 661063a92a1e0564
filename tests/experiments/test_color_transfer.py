"""color_transfer --quick: sparsity of each plan in the color transfer."""
import numpy as np
import pytest

from tests.experiments.conftest import pngs, quick_run
from vmoe_sparse_ot.experiments import color_transfer

NAME = 'color_transfer'


@pytest.fixture(scope='module')
def payload(out_dir, all_dir):
  return quick_run(NAME, out_dir, all_dir)


def test_files_and_keys(payload, out_dir):
  assert pngs(out_dir, NAME) == [f'{NAME}.png']
  assert set(payload['directions']) == {'china_to_flower', 'flower_to_china'}
  for ms in payload['directions'].values():
    assert set(ms) == set(color_transfer.METHODS)


def test_plan_sparsity(payload):
  for ms in payload['directions'].values():
    m, n = ms['entropic']['shape']
    assert ms['entropic']['percent_nonzeros'] == 100.0 and ms['entropic']['min_entry'] > 0
    assert ms['sparsity_constrained']['max_nonzeros_per_row'] <= payload['k']
    assert ms['unregularized']['nonzeros'] <= m + n - 1
    for method in ('sparsity_constrained', 'squared_l2', 'unregularized'):
      assert ms[method]['percent_nonzeros'] < 20.0
    # The semi-dual of the transposed problem meets the row marginals exactly.
    assert ms['sparsity_constrained']['max_row_marginal_error'] < 1e-12


def test_transfer_is_barycentric_projection():
  T = np.array([[0.2, 0.0], [0.1, 0.3]])
  Y = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
  labels = np.array([[0, 1], [1, 1]])
  out = color_transfer.transfer(T, Y, labels)
  np.testing.assert_allclose(out[0, 0], [1, 0, 0])
  np.testing.assert_allclose(out[0, 1], [0.25, 0.75, 0])
  assert out.shape == (2, 2, 3)
