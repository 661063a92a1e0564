"""formulations_2d --quick: the properties paper Figure 1 illustrates."""
import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from tests.experiments.conftest import pngs, quick_run
from vmoe_sparse_ot.experiments import formulations_2d

NAME = 'formulations_2d'


@pytest.fixture(scope='module')
def payload(out_dir, all_dir):
  return quick_run(NAME, out_dir, all_dir)


def test_files_and_keys(payload, out_dir):
  assert pngs(out_dir, NAME) == [f'{NAME}.png']
  for key in ('covariance_used', 'plans', 'limit_k1', 'gamma', 'epsilon', 'ks'):
    assert key in payload
  cov = np.array(payload['covariance_used'])
  assert np.allclose(cov, cov.T) and np.all(np.linalg.eigvalsh(cov) > 0)


def test_entropic_plan_is_fully_dense(payload):
  p = payload['plans']['entropic']
  assert p['nonzeros'] == formulations_2d.NUM_POINTS ** 2 and p['min_entry'] > 0


def test_sparsity_constrained_columns_have_at_most_k_nonzeros(payload):
  for k in payload['ks']:
    p = payload['plans'][f'sparsity_constrained_k{k}']
    assert 1 <= p['max_nonzeros_per_column'] <= k
  # Squared 2-norm is sparse, but its sparsity is not controlled (here > max k).
  sq = payload['plans']['squared_l2']
  assert sq['nonzeros'] < formulations_2d.NUM_POINTS ** 2
  assert sq['max_nonzeros_per_column'] > max(payload['ks'])


def test_unregularized_plan_is_a_vertex(payload):
  n = formulations_2d.NUM_POINTS
  assert payload['plans']['unregularized']['nonzeros'] <= 2 * n - 1


def test_k1_reaches_unregularized_cost_plus_gamma_half_norm_b(payload):
  """Proposition 4 (limit cases): at k = 1, S = D = P_0 + gamma/2 ||b||^2, and the k = 1 plan
  (one nonzero per column, columns summing to b) is an unregularized optimal plan."""
  _, _, a, b, C = formulations_2d.problem(0)
  # Independent reference: uniform marginals, m = n -> an assignment problem.
  rows, cols = linear_sum_assignment(C)
  p0 = C[rows, cols].sum() / len(a)
  lim = payload['limit_k1']
  assert lim['emd_cost'] == pytest.approx(p0, rel=1e-12)
  expected = p0 + 0.5 * payload['gamma'] * np.sum(b ** 2)
  assert lim['semi_dual_value'] == pytest.approx(expected, rel=1e-9)
  assert lim['plan_cost'] == pytest.approx(p0, rel=1e-9)
  assert lim['plan_regularized_cost'] == pytest.approx(expected, rel=1e-9)
  assert payload['plans']['sparsity_constrained_k1']['nonzeros'] == len(b)
