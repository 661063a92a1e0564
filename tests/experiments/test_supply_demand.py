"""Supply-demand transport on the sphere (paper appendix, after Amos et al. 2022)."""
import json

import numpy as np
import pytest

from tests.experiments.conftest import quick_run
from vmoe_sparse_ot.experiments import supply_demand


def test_quick_run_sparse_plan_respects_capacity_and_entropic_plan_is_dense(tmp_path, all_dir):
  payload = quick_run('supply_demand', tmp_path, all_dir)
  saved = json.loads((tmp_path / 'supply_demand.json').read_text())
  assert saved['plans'] == json.loads(json.dumps(payload['plans']))
  assert (tmp_path / 'supply_demand.png').stat().st_size > 10_000
  q = supply_demand.QUICK
  ent, sparse = payload['plans']['entropic'], payload['plans']['sparsity_constrained']
  # Entropic: every supplier serves every location.
  assert ent['nonzeros'] == q['num_supply'] * q['num_demand']
  # Sparsity-constrained: at most k locations per supplier (k binds: fewer nonzeros).
  assert sparse['max_nonzeros_per_supplier'] <= q['k']
  assert sparse['nonzeros'] < ent['nonzeros'] // 4
  # The semi-dual meets the supply marginals; the sparse plan is cheaper than the blur.
  assert sparse['column_marginal_error'] < 1e-3 * q['num_demand'] / q['num_supply']
  assert sparse['mean_cost_km'] < ent['mean_cost_km']
  assert 'sparsity_constrained' in supply_demand.format_table(payload)


def test_great_circle_and_vmf_by_hand():
  p = supply_demand.lonlat_to_xyz(np.array([0.0, 90.0, 0.0]), np.array([0.0, 0.0, 90.0]))
  d = supply_demand.great_circle_km(p, p)
  quarter = supply_demand.EARTH_RADIUS_KM * np.pi / 2
  np.testing.assert_allclose(d, quarter * (1 - np.eye(3)), atol=1e-6)
  lon, lat = supply_demand.xyz_to_lonlat(supply_demand.lonlat_to_xyz(-120.0, 35.0))
  assert (lon, lat) == pytest.approx((-120.0, 35.0))
  # von Mises-Fisher on S^2: E<x, mean> = coth(kappa) - 1 / kappa; unit norm.
  mean = supply_demand.lonlat_to_xyz(30.0, -20.0)
  for kappa in (2.0, 25.0):
    x = supply_demand.sample_vmf(np.random.default_rng(0), mean, kappa, 20_000)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-9)
    assert np.mean(x @ mean) == pytest.approx(1 / np.tanh(kappa) - 1 / kappa, abs=5e-3)
