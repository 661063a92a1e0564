"""The training loop in-process: learning, checkpoints, metrics, failure behaviour."""
import json
import math
import os
import shutil

import jax
import numpy as np
import pytest

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import errors
from vmoe_sparse_ot.train import periodic_eval
from vmoe_sparse_ot.train import trainer
from tests import compile_profile
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


def _records(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def test_tiny_config_trains_and_loss_falls(learned):
  workdir, summary = learned
  history = summary['train_loss_history']
  # Logged after step 1 (compilation), every 5 steps, and at the end.
  assert [s for s, _ in history] == [1, 5, 10, 15, 20, 25, 30, 35, 40]
  assert all(math.isfinite(x) for _, x in history)
  assert history[-1][1] < history[1][1] - 0.3, history
  losses = summary['losses']  # Every step's loss, read once per interval.
  assert len(losses) == 40
  assert history[0][1] == losses[0]
  assert history[1][1] == pytest.approx(np.mean(losses[1:5]), rel=1e-6)
  assert history[-1][1] == pytest.approx(np.mean(losses[35:]), rel=1e-6)
  assert summary['train_loss_last_interval_mean'] == summary['final_train_loss'] == \
      history[-1][1]
  assert summary['train_last_interval_steps'] == [36, 40]
  assert summary['eval']['num_examples'] == 300
  assert summary['eval']['accuracy'] > 0.3  # Chance is 0.1.
  assert sorted(os.listdir(os.path.join(workdir, 'checkpoints'))) == ['20', '40']
  assert any(f.startswith('events.out.tfevents') for f in os.listdir(workdir))
  with open(os.path.join(workdir, 'summary.json')) as f:
    written = json.load(f)
  assert written['step'] == 40 and written['eval'] == summary['eval']
  assert written['train_loss_last_interval_mean'] == summary['final_train_loss']
  params, step = checkpoints.restore_params(workdir)
  assert step == 40 and params['head']['kernel'].shape == (32, 10)


def test_metrics_jsonl_and_config_json(learned):
  workdir, summary = learned
  records = _records(workdir)
  train = [r for r in records if r['split'] == 'train']
  evals = [r for r in records if r['split'] == 'eval']
  assert [r['step'] for r in train] == [s for s, _ in summary['train_loss_history']]
  assert [r['loss'] for r in train] == [x for _, x in summary['train_loss_history']]
  for r in train:
    assert {'loss', 'accuracy', 'cross_entropy', 'auxiliary_loss', 'grad_norm',
            'learning_rate'} <= set(r)
    assert any(k.startswith('routing/encoderblock_1/') for k in r)
  assert 'steps_per_sec' not in train[0] and 'steps_per_sec' in train[1]  # Step 1 compiles.
  # The warmup schedule (5 steps to 3e-3): step t used lr(t - 1).
  assert train[0]['learning_rate'] == 0.0
  assert train[1]['learning_rate'] == pytest.approx(4 / 5 * 3e-3)
  assert [r['step'] for r in evals] == [20, 40]
  assert evals[-1]['accuracy'] == pytest.approx(summary['eval']['accuracy'])
  with open(os.path.join(workdir, 'config.json')) as f:
    written = json.load(f)
  want = json.loads(json.dumps(small_config('router=sparse_ot', **LEARN).to_dict()))
  assert written == want


def test_logged_metrics_are_interval_means_of_the_per_step_values(tmp_path):
  """Logging every step gives the per-step values; every 4 steps, their means."""
  overrides = dict(train_steps=9, log_every_steps=1)
  every = str(tmp_path / 'every')
  trainer.train_and_evaluate(small_config('router=topk', **overrides), every,
                             devices=jax.devices()[:1])
  per_step = {r['step']: r for r in _records(every) if r['split'] == 'train'}
  assert sorted(per_step) == list(range(1, 10))
  overrides['log_every_steps'] = 4
  interval = str(tmp_path / 'interval')
  compiles = []
  with compile_profile.counting_compiles(compiles):
    trainer.train_and_evaluate(small_config('router=topk', **overrides), interval,
                               devices=jax.devices()[:1])
  # Two programs of its own: the train step and the empty metrics buffer (both
  # sized by the interval). The initial state, the eval step and the
  # finiteness check are the first run's (train.programs' partial keys); the
  # equal step-1 values below show both runs start from the same state.
  assert len(compiles) == 2, compiles
  logged = {r['step']: r for r in _records(interval) if r['split'] == 'train'}
  assert sorted(logged) == [1, 4, 8, 9]
  for step, steps in ((1, [1]), (4, [2, 3, 4]), (8, [5, 6, 7, 8]), (9, [9])):
    for name in ('loss', 'accuracy', 'cross_entropy', 'grad_norm',
                 'routing/encoderblock_1/tokens_per_expert_min'):
      want = np.mean([per_step[s][name] for s in steps])
      assert logged[step][name] == pytest.approx(want, rel=1e-5, abs=1e-7), (step, name)


def test_restart_after_the_last_step_only_evaluates(learned):
  workdir, summary = learned
  again = trainer.train_and_evaluate(small_config('router=sparse_ot', **LEARN), workdir,
                                     devices=jax.devices()[:1])
  assert again['train_loss_history'] == [] and again['step'] == 40
  assert again['eval'] == pytest.approx(summary['eval'])


def test_checkpoint_config_mismatch_fails_clearly(learned):
  workdir, _ = learned
  config = small_config('router=sparse_ot', **dict(LEARN, model__hidden_size=48))
  with pytest.raises(ValueError, match=r'does not match the config(.|\n)*model.hidden_size: '
                     r'checkpoint 32, config 48'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  config = small_config('router=sparse_ot', **dict(LEARN, batch_size=32))
  with pytest.raises(ValueError, match='different input stream: dataset.batch_size: '
                     'checkpoint 16, config 32'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])


@pytest.mark.parametrize('overrides, named', [
    (dict(optimizer__name='sgd'), ["optimizer.name: checkpoint 'adam', config 'sgd'"]),
    (dict(optimizer__weight_decay=0.0, optimizer__b2=0.99),
     ['optimizer.b2: checkpoint 0.999, config 0.99',
      'optimizer.weight_decay: checkpoint 0.0001, config 0.0']),
])
def test_resuming_with_another_optimizer_names_the_setting(learned, overrides, named):
  workdir, _ = learned
  config = small_config('router=sparse_ot', **dict(LEARN, **overrides))
  with pytest.raises(errors.ResumeMismatchError, match='the optimizer differs') as e:
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  message = str(e.value)
  assert '\n' not in message and workdir in message
  for text in named:
    assert text in message
  assert message.count('optimizer.') == len(named)


def test_schedule_change_refused_unless_allowed(learned, tmp_path):
  workdir, _ = learned
  config = small_config('router=sparse_ot', **dict(LEARN, train_steps=45))
  with pytest.raises(errors.ResumeMismatchError,
                     match='train_steps: checkpoint 40, config 45.*allow_schedule_change'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  config = small_config('router=sparse_ot', **dict(LEARN, schedule__peak_value=1e-3))
  with pytest.raises(errors.ResumeMismatchError,
                     match=r'schedule.peak_value: checkpoint 0.003, config 0.001'):
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  copy = str(tmp_path / 'extended')
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns('.lock*'))
  config = small_config('router=sparse_ot', **dict(LEARN, train_steps=45))
  summary = trainer.train_and_evaluate(config, copy, devices=jax.devices()[:1],
                                       allow_schedule_change=True)
  assert summary['step'] == 45 and [s for s, _ in summary['train_loss_history']] == [41, 45]
  _, meta, step = checkpoints.restore_params_with_meta(copy)
  assert step == 45 and meta['train_steps'] == 45 and meta['step'] == 45


HUGE_LR = dict(train_steps=30, optimizer__name='sgd', optimizer__momentum=0.0,
               schedule__name='warmup_constant', schedule__warmup_steps=0)


# An infinite learning rate is refused by config validation (tests/config/test_validation.py);
# 3e38, near float32's largest, overflows to inf in the first update.
@pytest.mark.parametrize('peak_value', [1e30, 3e38])
def test_nan_never_reaches_a_checkpoint_and_the_last_good_one_restores(tmp_path, peak_value):
  config = small_config('router=topk', **HUGE_LR, schedule__peak_value=peak_value,
                        checkpoint__every_steps=1, checkpoint__keep=1)
  workdir = str(tmp_path)
  with pytest.raises(trainer.NonFiniteLossError,
                     match=r'Non-finite .* at step (\d+); stopping. ') as e:
    trainer.train_and_evaluate(config, workdir, devices=jax.devices()[:1])
  message = str(e.value)
  assert '\n' not in message
  bad_step = int(message.split('at step ')[1].split(';')[0])
  # Every step is checkpointed but the bad one; step bad - 1 gave the bad loss, and
  # keep=1 rotation spared bad - 2, the newest whose next loss was finite. Step
  # bad - 1 is moved aside when a good one precedes it.
  folders = os.listdir(os.path.join(workdir, 'checkpoints'))
  saved = sorted(int(d) for d in folders if d.isdigit())
  if bad_step <= 2:
    assert saved == [s for s in (bad_step - 1,) if s > 0]
    assert 'No checkpoint is known to be good' in message
    return
  assert saved == [bad_step - 2] and f'{bad_step - 1}.diverged' in folders
  good_step = bad_step - 2
  assert f'last good checkpoint is step {good_step} in' in message
  params, _ = checkpoints.restore_params(workdir, good_step)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_nan_between_checkpoints_is_caught_on_the_logging_step_with_its_step(tmp_path):
  # Logged at steps 1 and 5 (SMALL's log_every_steps): the NaN of step 2, 3 or 4 is
  # read at step 5 and named with its own step. (The step program is the one of
  # the test above: checkpointing builds none.)
  config = small_config('router=topk', **HUGE_LR, schedule__peak_value=1e30,
                        checkpoint__every_steps=1000)
  with pytest.raises(trainer.NonFiniteLossError, match=r'at step [2-4]; stopping\. No checkpoint '
                     r'is known to be good \(none precedes step'):
    trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  assert not os.listdir(os.path.join(tmp_path, 'checkpoints'))


def test_periodic_fewshot_runs_first_every_n_and_last_step(monkeypatch, tmp_path):
  from vmoe_sparse_ot.evaluate import transfer  # pylint: disable=g-import-not-at-top
  calls, models = [], []

  def fake_make_evaluator(config, model, mesh=None):
    del config, mesh
    models.append(model)
    return lambda params, model_state: calls.append(params) or {'fewshot/digits/1shot': 0.5}

  monkeypatch.setattr(transfer, 'make_evaluator', fake_make_evaluator)
  # Logged as the interval-means test's second run (its step program, reused).
  config = small_config('router=topk', train_steps=5, fewshot__every_steps=2, log_every_steps=4)
  with config.unlocked():
    config.evaluate.model_overrides = {'encoder': {'moe': {'router': {'capacity_factor': 4.0}}}}
  with pytest.raises(ValueError, match='config.fewshot.every_steps=2: periodic few-shot needs'):
    trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1],
                             fewshot=transfer.periodic_fewshot)
  assert len(calls) == 4  # Steps 1 (first), 2, 4 and 5 (last).
  # Few-shot reads the evaluation model (evaluate.model_overrides), as the reference.
  from vmoe_sparse_ot import nn  # pylint: disable=g-import-not-at-top
  model = nn.build_model(config.model)
  assert models == [periodic_eval.eval_model(config, model)] and models[0] != model


def test_evaluation_with_model_overrides_drops_fewer_tokens(tmp_path, topk_six_steps):
  """config.evaluate.model_overrides: the evaluations during training (here the final
  one) run the model with capacity factor 4.0, the training keeps its own. The run
  is `topk_six_steps` (capacity factor 1.0: C = ceil(32 * 2 * 1.0 / 4) = 16 of S = 32
  tokens) but for the override, so it trains the same steps and only its
  evaluation differs: at 4.0, C = 64 capped at S = 32, so no token is dropped."""
  from tests.train import helpers
  _, plain = topk_six_steps
  config = helpers.small_config('router=topk', **helpers.SIX_STEPS)
  assert config.model.encoder.moe.router.capacity_factor == 1.0
  config.evaluate.model_overrides = {'encoder': {'moe': {'router': {'capacity_factor': 4.0}}}}
  summary = trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  assert summary['losses'] == plain['losses']                    # the same training
  with open(os.path.join(tmp_path, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  assert plain['eval']['dropped_fraction'] > 0.05                # its evaluation drops
  assert summary['eval']['dropped_fraction'] == 0.0              # at 4.0, none
  assert summary['eval']['num_examples'] == plain['eval']['num_examples'] == 300
  assert records[-1]['split'] == 'eval' and records[-1]['dropped_fraction'] == 0.0
  # The accuracy changed only through routing (same parameters).
  assert summary['eval']['loss'] != plain['eval']['loss']
