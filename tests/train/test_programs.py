"""train.programs: a run's jitted functions kept for the next run with the same key."""
import jax

from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import programs
from vmoe_sparse_ot.train import run as run_lib
from tests.train.helpers import small_config


def _mesh(devices):
  return parallel.make_mesh(small_config().mesh, devices, 4)


def test_key_changes_with_the_config_the_mesh_and_the_components():
  config, mesh = small_config(), _mesh(jax.devices()[:1])
  router = object()
  key = programs.run_key(config, mesh, (router,))
  assert key == programs.run_key(small_config(), _mesh(jax.devices()[:1]), (router,))
  assert hash(key) == hash(programs.run_key(small_config(), mesh, (router,)))
  assert key != programs.run_key(small_config(optimizer__b2=0.99), mesh, (router,))
  assert key != programs.run_key(small_config(schedule__peak_value=1e-2), mesh, (router,))
  assert key != programs.run_key(config, _mesh(jax.devices()[1:2]), (router,))
  assert key != programs.run_key(config, _mesh(jax.devices()[:2]), (router,))
  assert key != programs.run_key(config, mesh, (object(),))   # e.g. a router registered anew


def test_key_leaves_out_what_only_drives_the_loop():
  mesh = _mesh(jax.devices()[:1])
  key = programs.run_key(small_config(), mesh)
  # SMALL fixes schedule.decay_steps: the length and the cadences build no function.
  assert key == programs.run_key(small_config(
      train_steps=17, checkpoint__every_steps=3, checkpoint__keep=1, eval_every_steps=2,
      fewshot__every_steps=4), mesh)
  # A decay that runs until the last step makes the schedule, so the step, depend
  # on train_steps; so do the logging interval (the metrics buffer) and the batch.
  until_last = dict(schedule__decay_steps=None, schedule__warmup_steps=5)
  assert (programs.run_key(small_config(train_steps=20, **until_last), mesh)
          != programs.run_key(small_config(train_steps=21, **until_last), mesh))
  assert (programs.run_key(small_config(train_steps=20, **until_last), mesh)
          == programs.run_key(small_config(train_steps=20, eval_every_steps=5, **until_last),
                              mesh))
  assert key != programs.run_key(small_config(log_every_steps=4), mesh)
  assert key != programs.run_key(small_config(batch_size=32), mesh)


def test_key_leaves_out_where_the_run_starts():
  """The seed and a source of weights choose the initial state, not the programs:
  their random keys are arguments or state data."""
  mesh = _mesh(jax.devices()[:1])
  key = programs.run_key(small_config(), mesh)
  assert key == programs.run_key(small_config(seed=1), mesh)
  assert key == programs.run_key(small_config(initialization__path='/w/dense',
                                              initialization__step=3), mesh)
  for only in (run_lib.VARIABLES_FROM, run_lib.STATE_FROM, run_lib.EVAL_FROM):
    assert (programs.run_key(small_config(seed=1), mesh, only=only)
            == programs.run_key(small_config(), mesh, only=only))


def test_partial_keys_hold_only_what_their_functions_are_built_from():
  mesh = _mesh(jax.devices()[:1])

  def key(only, **overrides):
    return programs.run_key(small_config(**overrides), mesh, only=only)

  variables, state = run_lib.VARIABLES_FROM, run_lib.STATE_FROM
  evaluation = run_lib.EVAL_FROM
  # Another loss, batch, logging interval or label smoothing trains with another
  # step, from the same initial state.
  for other in (dict(loss__name='sigmoid_xent'), dict(batch_size=32), dict(log_every_steps=1),
                dict(label_smoothing=0.1), dict(eval_batch_size=32)):
    assert key(variables, **other) == key(variables), other
    assert key(state, **other) == key(state), other
  # The initial state closes over the optimizer, so over its schedule: another
  # learning rate or length (when the decay runs to the last step) is another
  # state program, and the same model variables.
  for other in (dict(optimizer__b2=0.99), dict(optimizer__name='sgd'),
                dict(schedule__peak_value=1e-2), dict(train_steps=50, schedule__decay_steps=None)):
    assert key(variables, **other) == key(variables), other
    assert key(state, **other) != key(state), other
  for other in (dict(model__hidden_size=48), dict(dataset__image_size=32),
                dict(dataset__channels=3)):
    assert key(variables, **other) != key(variables), other
    assert key(state, **other) != key(state), other
  # The evaluation step: the model and the loss only.
  for other in (dict(seed=1), dict(schedule__peak_value=1e-2), dict(optimizer__name='sgd'),
                dict(batch_size=32), dict(eval_batch_size=32)):
    assert key(evaluation, **other) == key(evaluation), other
  for other in (dict(loss__name='sigmoid_xent'), dict(model__encoder__num_layers=4)):
    assert key(evaluation, **other) != key(evaluation), other
  # The mesh alone; a partial key is never a whole run's.
  assert key((), seed=1, model__hidden_size=48) == key(())
  assert key((), seed=1) != programs.run_key(small_config(), _mesh(jax.devices()[1:2]), only=())
  assert key(state) != programs.run_key(small_config(), mesh)


def test_get_builds_once_per_key_and_name_and_keeps_the_latest_keys():
  programs.clear()
  built = []

  def build(value):
    def make():
      built.append(value)
      return value
    return make

  mesh = _mesh(jax.devices()[:1])
  keys = [programs.run_key(small_config(log_every_steps=s + 1), mesh)
          for s in range(programs.MAX_KEYS + 1)]
  assert programs.get(keys[0], 'step', build('a')) == 'a'
  assert programs.get(keys[0], 'step', build('b')) == 'a'      # kept
  assert programs.get(keys[0], 'eval', build('c')) == 'c'      # another name
  assert programs.get(keys[1], 'step', build('d')) == 'd'      # another key
  assert programs.get(keys[0], 'step', build('x')) == 'a'      # used again: keys[1] is older
  for key in keys[2:]:                                          # one key too many...
    programs.get(key, 'step', build('e'))
  assert programs.get(keys[1], 'step', build('f')) == 'f'      # ...keys[1] went first
  assert programs.get(keys[0], 'step', build('g')) == 'g'
  assert built == ['a', 'c', 'd'] + ['e'] * (programs.MAX_KEYS - 1) + ['f', 'g']
  programs.clear()
  assert programs.get(keys[0], 'step', build('h')) == 'h'
  programs.clear()
