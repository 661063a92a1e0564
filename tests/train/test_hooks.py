"""train.hooks: each periodic action on its schedule, with stand-ins for the
checkpointer, the finiteness check, the evaluation and the writer."""
import contextlib
import logging
import types

import pytest

from vmoe_sparse_ot.errors import NonFiniteLossError
from vmoe_sparse_ot.train import hooks
from vmoe_sparse_ot.train import periodic_eval

GOOD = types.SimpleNamespace(first_nonfinite_step=0)   # TrainMetrics as far as hooks read them


class Progress:
  """ProgressLogger's `paused()`, remembering whether the clock is paused."""

  def __init__(self):
    self.is_paused = False

  @contextlib.contextmanager
  def paused(self):
    self.is_paused = True
    try:
      yield
    finally:
      self.is_paused = False


class Checkpointer:

  def __init__(self, progress):
    self.progress, self.saved = progress, []

  def save(self, step, state, record):
    assert self.progress.is_paused
    self.saved.append((step, state, record))

  def last_good(self, first_bad_step):
    return f'Resume from before step {first_bad_step}.'


def _checkpointing(every_steps=3, last_step=7):
  progress = Progress()
  ckpt = Checkpointer(progress)
  record = {'model': 'm'}
  hook = hooks.checkpoint_every(every_steps, last_step, ckpt, record,
                                lambda state: state['finite'], progress)
  return hook, ckpt, record


def test_checkpoints_every_n_steps_and_the_last_with_the_record_and_its_step():
  hook, ckpt, record = _checkpointing()
  for step in range(1, 8):
    hook(step, state={'finite': True, 'step': step}, metrics=GOOD)
  assert [(s, state['step'], r) for s, state, r in ckpt.saved] == [
      (3, 3, {'model': 'm', 'step': 3}), (6, 6, {'model': 'm', 'step': 6}),
      (7, 7, {'model': 'm', 'step': 7})]
  assert record == {'model': 'm'}               # the run's record is left as it was


def test_a_nonfinite_state_or_interval_is_never_saved_and_names_its_step():
  hook, ckpt, _ = _checkpointing()
  hook(2, state={'finite': False}, metrics=GOOD)   # no checkpoint at step 2: not checked
  with pytest.raises(NonFiniteLossError) as e:
    hook(3, state={'finite': False}, metrics=GOOD)
  # Parameters after step 3 make the loss of step 4 non-finite.
  assert str(e.value) == ('Non-finite parameters or optimizer state at step 3; stopping. '
                          'Resume from before step 4.')
  hook, ckpt, _ = _checkpointing()
  hook(2, state={'finite': True}, metrics=GOOD)
  with pytest.raises(NonFiniteLossError) as e:
    hook(3, state={'finite': True}, metrics=types.SimpleNamespace(first_nonfinite_step=2))
  assert str(e.value) == ('Non-finite training loss or gradient at step 2; stopping. '
                          'Resume from before step 2.')
  assert ckpt.saved == []


@pytest.mark.parametrize('every_steps, evaluated', [(3, [3, 6, 7]), (0, [7])])
def test_evaluates_every_n_steps_and_the_last_and_logs_each_set(every_steps, evaluated,
                                                                 caplog):
  progress, written, seen = Progress(), [], []

  def run_eval(state):
    assert progress.is_paused
    seen.append(state)
    return {'': {'loss': 0.5, 'accuracy': 0.25, 'num_examples': 8}}

  class Writer:
    def write_scalars(self, step, scalars):
      written.append((step, scalars))

    def flush(self):
      pass

  eval_set = periodic_eval.EvalSet('', 'mnist', 'test', None, 'label')
  hook = hooks.evaluate_every(every_steps, 7, run_eval, [eval_set], Writer(), progress)
  with caplog.at_level(logging.INFO):
    for step in range(1, 8):
      hook(step, state=step, metrics=GOOD)
  assert seen == evaluated
  assert written == [(s, {'eval/loss': 0.5, 'eval/accuracy': 0.25, 'eval/num_examples': 8})
                     for s in evaluated]
  assert hook.get_last_callback_result() == {'': {'loss': 0.5, 'accuracy': 0.25,
                                                  'num_examples': 8}}
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('eval at')]
  assert [line.split(',')[0] for line in lines] == [
      f'eval at step {s} on test: loss 0.5000' for s in evaluated]


def test_fewshot_is_offered_every_step_with_the_params_and_the_router_state():
  progress, calls = Progress(), []

  def fewshot(step, params, model_state):
    assert progress.is_paused
    calls.append((step, params, model_state))

  hook = hooks.fewshot_every_step(fewshot, progress)
  for step in range(1, 4):
    hook(step, state=types.SimpleNamespace(params=f'p{step}', model_state={'bias': step}),
         metrics=GOOD)
  assert calls == [(1, 'p1', {'bias': 1}), (2, 'p2', {'bias': 2}), (3, 'p3', {'bias': 3})]
