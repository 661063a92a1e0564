"""k_convergence --quick: L-BFGS reaches smaller gradients with k = 4 than with k = 2."""
import pytest

from tests.experiments.conftest import pngs, quick_run

NAME = 'k_convergence'


@pytest.fixture(scope='module')
def payload(out_dir, all_dir):
  return quick_run(NAME, out_dir, all_dir)


def test_files_and_keys(payload, out_dir):
  assert pngs(out_dir, NAME) == [f'{NAME}.png']
  assert payload['ks'] == [2, 4]
  for runs in payload['datasets'].values():
    assert set(runs) == {'semi_dual_k2', 'semi_dual_k4', 'dual_k2', 'dual_k4'}


def test_larger_k_converges_faster(payload):
  for runs in payload['datasets'].values():
    for formulation in ('semi_dual', 'dual'):
      r2, r4 = runs[f'{formulation}_k2'], runs[f'{formulation}_k4']
      assert r4['min_grad_norm'] < r2['min_grad_norm']
      assert r4['median_grad_norm_last_100'] < r2['median_grad_norm_last_100']
      assert r4['iterations_to']['0.01'] < r2['iterations_to']['0.01']
      # Omega*_+ and Omega*_b grow with k (more terms / a larger feasible set), so the
      # (semi-)dual optimum -- the regularized primal value -- can only shrink.
      assert r4['final_value'] <= r2['final_value'] + 1e-9
