"""config.loss, mixup and evaluate.datasets in one short run: each eval set logged under its
name. (Their one-line checks: tests/config/.)"""
import json
import os

import jax
import numpy as np
import pytest

from vmoe_sparse_ot import plot
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.train import trainer
from tests.train.helpers import ONEHOT
from tests.train.helpers import unlocked_config


def _mixed_config():
  """Mixup and sigmoid_xent over 2 microsteps; the eval split plus two named sets."""
  return unlocked_config(train_steps=3, microsteps=2, **{
      'loss.name': 'sigmoid_xent', 'mixup.p': 0.5, 'dataset.pp_train': ONEHOT,
      'dataset.pp_eval': ONEHOT, 'dataset.eval_split': 'test[:64]',
      'evaluate.datasets': {
          # Only the one-hot targets: precision@1 and the loss read 'labels'.
          'onehot': {'split': 'test[:64]', 'pp': f"{ONEHOT}|keep('image', 'labels')"},
          'val': {'dataset': 'embedded_mnist', 'split': 'validation[:32]'},
      }})


@pytest.fixture(scope='module')
def mixed_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp('mixup'))
  config = _mixed_config()
  config_lib.validate(config)
  config_lib.check_datasets(config)
  summary = trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  return workdir, summary


def test_each_eval_dataset_is_logged_under_its_name(mixed_run):
  workdir, summary = mixed_run
  assert summary['step'] == 3 and np.isfinite(summary['losses']).all()
  assert summary['eval']['num_examples'] == 64
  assert sorted(summary['eval_datasets']) == ['onehot', 'val']
  assert summary['eval_datasets']['val']['num_examples'] == 32
  # The same examples and targets, read from 'labels' only: the same numbers.
  assert summary['eval_datasets']['onehot'] == pytest.approx(summary['eval'], rel=1e-6)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    evals = [r for r in map(json.loads, f) if r['split'] == 'eval']
  assert [r['step'] for r in evals] == [3]
  assert evals[0]['val/accuracy'] == pytest.approx(summary['eval_datasets']['val']['accuracy'])
  assert {'loss', 'accuracy', 'num_examples', 'onehot/loss', 'val/loss',
          'val/num_examples'} <= set(evals[0])
  tags = plot.read_scalars(workdir)
  assert {'eval/loss', 'eval/onehot/loss', 'eval/val/accuracy'} <= set(tags)
  with open(os.path.join(workdir, 'summary.json')) as f:
    assert json.load(f)['eval_datasets']['val'] == summary['eval_datasets']['val']


def test_restart_after_the_last_step_evaluates_every_dataset(mixed_run, caplog):
  workdir, summary = mixed_run
  with caplog.at_level('INFO'):
    again = trainer.train_and_evaluate(_mixed_config(), workdir, devices=jax.devices()[:1])
  assert again['losses'] == [] and again['eval'] == pytest.approx(summary['eval'])
  assert again['eval_datasets']['val'] == pytest.approx(summary['eval_datasets']['val'])
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('eval at')]
  assert [line.split(':')[0] for line in lines] == [
      'eval at step 3 on test[', 'eval at step 3 on onehot (embedded_mnist test[',
      'eval at step 3 on val (embedded_mnist validation[']
