"""Every router trains; a data x expert mesh of 8 devices matches one device."""
import math

import jax
import numpy as np
import pytest

from vmoe_sparse_ot.train import trainer
from tests.train import helpers
from tests.train.helpers import small_config

STEPS = helpers.SIX_STEPS['train_steps']


@pytest.fixture(scope='module')
def runs(tmp_path_factory, request):
  cache = {}

  def run(router, devices=1, **overrides):
    key = (router, devices)
    if key == ('topk', 1):  # Shared with test_multiprocess.py (tests/train/conftest.py).
      return request.getfixturevalue('topk_six_steps')[1]
    if key not in cache:
      # No checkpoint: it would not change the losses.
      config = small_config(f'router={router}', train_steps=STEPS, **overrides)
      cache[key] = trainer.train_and_evaluate(
          config, str(tmp_path_factory.mktemp(f'{router}{devices}')),
          devices=jax.devices()[:devices])
    return cache[key]
  return run


@pytest.mark.parametrize('router', ['topk', 'sbase', 'expert_choice'])
def test_each_router_trains_a_few_steps(runs, router):
  # sparse_ot, the tiny config's own router, is trained in test_trainer.py; soft_moe
  # through the command line in tests/test_cli.py (the short run's console).
  summary = runs(router)
  assert len(summary['losses']) == STEPS
  assert all(math.isfinite(x) for x in summary['losses'])
  assert 0.0 <= summary['eval']['accuracy'] <= 1.0


def test_eight_devices_data_by_expert_match_one_device(runs):
  one = runs('topk')
  eight = runs('topk', devices=8, mesh__expert=2)  # Mesh data 4 x expert 2.
  np.testing.assert_allclose(eight['losses'], one['losses'], rtol=2e-5)
  assert eight['eval']['accuracy'] == pytest.approx(one['eval']['accuracy'], abs=1e-6)
  assert eight['eval']['loss'] == pytest.approx(one['eval']['loss'], rel=1e-5)
