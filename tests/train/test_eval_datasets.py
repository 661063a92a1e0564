"""config.loss / mixup / evaluate.datasets: one-line checks, and one short run using them all."""
import json
import os

import jax
import numpy as np
import pytest

from vmoe_sparse_ot import plot
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.config import pp_targets
from vmoe_sparse_ot.train import trainer
from tests.train.helpers import small_config

PP = 'decode(channels=1)|value_range(-1, 1)'
ONEHOT = f"{PP}|onehot(10, key='label', key_result='labels')"
IMAGE = ((28, 28, 1), 'float32')


def _problem(entries, **kw):
  args = dict(pp_key='dataset.pp_train', pp='P', num_classes=10, loss='softmax_xent',
              training=True)
  return pp_targets.problem(entries, **{**args, **kw})


def test_pp_output_against_loss_and_mixup():
  label, labels = ((), 'int32'), ((10,), 'float32')
  assert _problem({'image': IMAGE, 'label': label}) is None
  assert _problem({'image': IMAGE, 'labels': labels}, loss='sigmoid_xent', mixup_p=0.2) is None
  assert _problem({'image': IMAGE, 'label': label}, mixup_p=0.2) == (
      "config.mixup.p=0.2: mixup needs one-hot 'labels' float32 (10,) from "
      "config.dataset.pp_train; add onehot(10, key='label', key_result='labels') to it")
  assert _problem({'image': IMAGE, 'label': label}, loss='sigmoid_xent', training=False,
                  pp_key='dataset.pp_eval', pp=None) == (
      "config.loss.name='sigmoid_xent': needs one-hot or multi-hot 'labels' float32 (10,) "
      "from config.dataset.pp_eval; a pp string ending with onehot(10, key='label', "
      "key_result='labels')")
  assert _problem({'image': IMAGE, 'labels': ((5,), 'float32')}) == (
      "config.dataset.pp_train: pp 'P' gives 'labels' float32 of shape (5,); the loss reads "
      'float32 (10,) (config.model.num_classes=10)')
  assert _problem({'image': IMAGE}).startswith(
      "config.dataset.pp_train: pp 'P' leaves no integer 'label' (entries: image)")
  assert _problem({'image': IMAGE, 'label': ((None,), 'int32'), 'labels': labels},
                  training=False, pp_key='evaluate.datasets.real.pp') == (
      "config.evaluate.datasets.real.pp: pp 'P' gives entry 'label' of varying shape "
      '(None,); evaluation needs fixed shapes (drop it with keep(...) or drop(...))')


BAD = [
    ({'loss.name': 'xent'},
     "config.loss.name='xent': must be one of ['softmax_xent', 'sigmoid_xent']"),
    ({'mixup.p': -0.1}, 'config.mixup.p=-0.1: must be >= 0'),
    ({'mixup.alpha': 0.2}, "unknown key(s) ['alpha'] in config.mixup; valid keys: ['p']"),
    ({'loss.name': 'sigmoid_xent', 'label_smoothing': 0.1},
     "config.label_smoothing=0.1: applies to config.loss.name='softmax_xent' only, not "
     "'sigmoid_xent' (smooth the targets in the pp string: onehot(..., on=, off=))"),
    ({'evaluate.datasets': {'a/b': {'split': 'test'}}},
     "config.evaluate.datasets: name 'a/b' must be letters, digits, '_', '.' or '-' (it "
     'names the metrics eval/NAME/...)'),
    ({'evaluate.datasets': {'val': {'dataset': 'embedded_mnist'}}},
     "config.evaluate.datasets.val.split=None: must be a TFDS split such as \"test\" "
     '(required)'),
    ({'evaluate.datasets': {'val': {'split': 'test', 'labelkey': 'x'}}},
     "unknown key(s) ['labelkey'] in config.evaluate.datasets.val; valid keys: ['dataset', "
     "'label_key', 'pp', 'split']"),
    ({'evaluate.datasets': {'val': {'split': 'test', 'pp': 'decode|flip_lr'}}},
     "config.evaluate.datasets.val.pp='decode|flip_lr': op 'flip_lr' is random: evaluation "
     'preprocessing must be deterministic (random ops belong in pp_train)'),
]


def _config(**overrides):
  config = small_config()
  config.unlock()
  config.update_from_flattened_dict(overrides)
  return config


@pytest.mark.parametrize('overrides,message', BAD, ids=[str(o) for o, _ in BAD])
def test_bad_loss_mixup_and_eval_dataset_values_are_one_line(overrides, message):
  with pytest.raises(ValueError) as info:
    config_lib.validate(_config(**overrides))
  assert str(info.value) == message


TRACED = [
    ({'mixup.p': 0.2}, "config.mixup.p=0.2: mixup needs one-hot 'labels' float32 (10,) from "
     'config.dataset.pp_train'),
    ({'loss.name': 'sigmoid_xent', 'dataset.pp_train': ONEHOT},
     "config.loss.name='sigmoid_xent': needs one-hot or multi-hot 'labels' float32 (10,) from "
     'config.dataset.pp_eval'),
    ({'dataset.pp_train': f"{PP}|onehot(12, key='label', key_result='labels')"},
     'config.dataset.pp_train: pp "decode(channels=1)|value_range(-1, 1)|onehot(12, '
     "key='label', key_result='labels')\" gives 'labels' float32 of shape (12,); the loss "
     'reads float32 (10,) (config.model.num_classes=10)'),
    ({'evaluate.datasets': {'val': {'split': 'valid'}}},
     "config.evaluate.datasets.val: dataset 'embedded_mnist' has no split 'valid'"),
    ({'evaluate.datasets': {'val': {'split': 'test', 'label_key': 'real_label'}}},
     "config.evaluate.datasets.val: dataset 'embedded_mnist' has no feature 'real_label' "
     '(features: image, label)'),
    ({'evaluate.datasets': {'val': {'split': 'test', 'pp': f"{PP}|keep('image')"}}},
     "config.evaluate.datasets.val.pp: pp \"decode(channels=1)|value_range(-1, 1)|"
     "keep('image')\" leaves no integer 'label' (entries: image)"),
]


@pytest.mark.parametrize('overrides,message', TRACED, ids=[str(o) for o, _ in TRACED])
def test_pp_output_that_the_loss_cannot_read_is_one_line_before_training(overrides, message):
  config = _config(**overrides)
  config_lib.validate(config)
  with pytest.raises(ValueError) as info:
    config_lib.check_datasets(config)
  assert str(info.value).startswith(message) and '\n' not in str(info.value)


def _mixed_config():
  """Mixup and sigmoid_xent over 2 microsteps; the eval split plus two named sets."""
  return _config(train_steps=3, microsteps=2, **{
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
