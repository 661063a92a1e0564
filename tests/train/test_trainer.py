"""The training loop in-process: learning, routers, sharding, failure behaviour."""
import json
import math
import os

import jax
import numpy as np
import pytest

from vmoe_sparse_ot.train import checkpoints
from vmoe_sparse_ot.train import trainer
from tests.train.helpers import small_config

ONE_DEVICE = None  # Set lazily: jax.devices()[:1].


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Runs each (name, config) once per module; tests share the results."""
  cache = {}

  def run(name, config, devices=1):
    if name not in cache:
      workdir = str(tmp_path_factory.mktemp(name))
      summary = trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:devices])
      cache[name] = (workdir, summary)
    return cache[name]
  return run


def test_tiny_config_trains_and_loss_falls(runs):
  config = small_config('router=sparse_ot', train_steps=60, schedule__peak_value=3e-3,
                        eval_every_steps=30, checkpoint__every_steps=30)
  workdir, summary = runs('sparse_ot', config)
  losses = summary['losses']
  assert len(losses) == 60 and all(math.isfinite(x) for x in losses)
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3, losses
  assert summary['eval']['num_examples'] == 300
  assert summary['eval']['accuracy'] > 0.3  # Chance is 0.1.
  # Checkpoints, metrics and summary are written.
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['30', '60']
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(workdir))
  with open(os.path.join(workdir, 'summary.json')) as f:
    assert json.load(f)['step'] == 60
  params, step = checkpoints.restore_params(workdir)
  assert step == 60 and params['head']['kernel'].shape == (32, 10)


@pytest.mark.parametrize('router', ['topk', 'sbase', 'expert_choice'])
def test_each_router_trains_a_few_steps(runs, router):
  _, summary = runs(router, small_config(f'router={router}', train_steps=6))
  assert len(summary['losses']) == 6 and all(math.isfinite(x) for x in summary['losses'])
  assert 0.0 <= summary['eval']['accuracy'] <= 1.0


def test_eight_devices_data_by_expert_match_one_device(runs):
  _, one = runs('topk', small_config('router=topk', train_steps=6))
  _, eight = runs('topk_8dev', small_config('router=topk', train_steps=6, mesh__expert=2),
                  devices=8)
  np.testing.assert_allclose(eight['losses'], one['losses'], rtol=2e-5)
  assert eight['eval']['accuracy'] == pytest.approx(one['eval']['accuracy'], abs=1e-6)


def test_nan_loss_stops_naming_the_step_and_keeps_last_good_checkpoint(tmp_path):
  config = small_config('router=topk', train_steps=30, optimizer__name='sgd',
                        optimizer__momentum=0.0, schedule__name='warmup_constant',
                        schedule__warmup_steps=0, schedule__peak_value=1e30,
                        checkpoint__every_steps=1, checkpoint__keep=1)
  with pytest.raises(trainer.NonFiniteLossError,
                     match=r'Non-finite training loss .* at step (\d+); stopping') as e:
    trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  bad_step = int(str(e.value).split('at step ')[1].split(';')[0])
  params, good_step = checkpoints.restore_params(str(tmp_path))
  assert good_step == bad_step - 1
  assert f'step {good_step} in' in str(e.value)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_checkpoint_config_mismatch_fails_clearly(runs):
  workdir, _ = runs('sparse_ot', small_config('router=sparse_ot', train_steps=60,
                                              schedule__peak_value=3e-3, eval_every_steps=30,
                                              checkpoint__every_steps=30))
  config = small_config('router=sparse_ot', train_steps=70, model__hidden_size=48)
  with pytest.raises(ValueError, match=r'does not match the config(.|\n)*model.hidden_size: '
                     r'checkpoint 32, config 48'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  config = small_config('router=sparse_ot', train_steps=70, batch_size=32)
  with pytest.raises(ValueError, match='different input stream'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
