"""The training loop in-process: learning, checkpoints, metrics, failure behaviour."""
import json
import math
import os

import jax
import numpy as np
import pytest

from vmoe_sparse_ot.train import checkpoints
from vmoe_sparse_ot.train import trainer
from tests.train.helpers import small_config

# The tiny config's own router (sparse_ot) on an MNIST subset.
LEARN = dict(train_steps=40, schedule__peak_value=3e-3, eval_every_steps=20,
             checkpoint__every_steps=20)


@pytest.fixture(scope='module')
def learned(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('learn'))
  summary = trainer.train_and_evaluate(small_config('router=sparse_ot', **LEARN), workdir,
                                       devices=jax.devices()[:1])
  return workdir, summary


def test_tiny_config_trains_and_loss_falls(learned):
  workdir, summary = learned
  losses = summary['losses']
  assert len(losses) == 40 and all(math.isfinite(x) for x in losses)
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.3, losses
  assert summary['eval']['num_examples'] == 300
  assert summary['eval']['accuracy'] > 0.3  # Chance is 0.1.
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['20', '40']
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(workdir))
  with open(os.path.join(workdir, 'summary.json')) as f:
    written = json.load(f)
  assert written['step'] == 40 and written['eval'] == summary['eval']
  params, step = checkpoints.restore_params(workdir)
  assert step == 40 and params['head']['kernel'].shape == (32, 10)


def test_restart_after_the_last_step_only_evaluates(learned):
  workdir, summary = learned
  again = trainer.train_and_evaluate(small_config('router=sparse_ot', **LEARN), workdir,
                                     devices=jax.devices()[:1])
  assert again['losses'] == [] and again['step'] == 40
  assert again['eval'] == pytest.approx(summary['eval'])


def test_checkpoint_config_mismatch_fails_clearly(learned):
  workdir, _ = learned
  config = small_config('router=sparse_ot', **dict(LEARN, model__hidden_size=48))
  with pytest.raises(ValueError, match=r'does not match the config(.|\n)*model.hidden_size: '
                     r'checkpoint 32, config 48'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  config = small_config('router=sparse_ot', **dict(LEARN, batch_size=32))
  with pytest.raises(ValueError, match='different input stream'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])


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


def test_periodic_fewshot_runs_first_every_n_and_last_step(monkeypatch, tmp_path):
  from vmoe_sparse_ot.evaluate import fewshot  # pylint: disable=g-import-not-at-top
  calls = []

  def fake_make_evaluator(config, model, mesh=None):
    del config, model, mesh
    return lambda params: calls.append(params) or {'fewshot/digits/1shot': 0.5}

  monkeypatch.setattr(fewshot, 'make_evaluator', fake_make_evaluator)
  config = small_config('router=topk', train_steps=5, fewshot__every_steps=2)
  trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  assert len(calls) == 4  # Steps 1 (first), 2, 4 and 5 (last).
