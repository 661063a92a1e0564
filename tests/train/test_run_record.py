"""train.run_record: what a checkpoint records, and the rules for older records."""
import jax
import ml_collections
import numpy as np
import pytest

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import errors
from vmoe_sparse_ot.errors import ResumeMismatchError
from vmoe_sparse_ot.nn import model_config
from vmoe_sparse_ot.train import run_record
from tests.train.helpers import small_config


def test_checkpoints_from_before_dataset_sampling_resume_with_stream():
  # What a checkpoint recorded before config.dataset.sampling existed.
  old = {'data': {'name': 'embedded_mnist', 'split': 'train[:4096]', 'batch_size': 16,
                  'seed': 0, 'shuffle_buffer': 1024}}
  config = small_config('router=sparse_ot', dataset__sampling='stream', seed=0)
  stream = run_record.stream(config.dataset, 16, 0)
  assert stream == old['data']
  run_record.check_resume(old, {'data': stream}, 'DIR')
  config = small_config('router=sparse_ot', seed=0)
  index = run_record.stream(config.dataset, 16, 0)
  assert index == {**{k: v for k, v in old['data'].items() if k != 'shuffle_buffer'},
                   'sampling': 'index'}
  with pytest.raises(errors.ResumeMismatchError,
                     match=r"dataset.sampling: checkpoint '<absent>', config 'index'.*"
                     r"config.dataset.sampling='stream': set it to resume"):
    run_record.check_resume(old, {'data': index}, 'DIR')


def test_optimizer_keys_added_later_are_left_out_at_their_defaults():
  config = small_config()
  record = run_record.optimizer(config.optimizer)
  assert not {'freeze', 'mu_dtype', 'param_naming'} & set(record)
  assert record == {k: v for k, v in config.optimizer.to_dict().items()
                    if k not in ('freeze', 'mu_dtype', 'param_naming')}
  with config.unlocked():
    config.optimizer.freeze = 'encoder/.*'
    config.optimizer.param_naming = 'reference'
  record = run_record.optimizer(config.optimizer)
  assert record['freeze'] == 'encoder/.*' and record['param_naming'] == 'reference'


def test_the_record_holds_the_run_and_its_parameter_shapes():
  config = small_config(train_steps=7)
  record = run_record.make(config, {'dense': {'kernel': np.zeros((3, 4))}})
  assert sorted(record) == ['data', 'model_config', 'optimizer', 'param_shapes', 'schedule',
                            'train_steps']
  assert record['train_steps'] == 7 and record['param_shapes'] == {'dense/kernel': [3, 4]}
  assert record['data'] == {'name': config.dataset.name, 'split': config.dataset.train_split,
                            'batch_size': config.batch_size, 'seed': config.seed,
                            'sampling': 'index'}


MODEL = {'name': 'vit', 'hidden_size': 8, 'encoder': {'num_layers': 2}}
PARAMS = {'a': {'kernel': jax.ShapeDtypeStruct((2, 3), np.float32)}, 'b': np.zeros(5)}


def test_same_model_and_shapes_resume():
  meta = {'model_config': MODEL, 'param_shapes': {'a/kernel': [2, 3], 'b': [5]}}
  run_record.check_compatible(meta, MODEL, PARAMS, 'W')   # No exception.


def test_every_model_key_and_parameter_shape_that_differs_is_named_in_one_line():
  meta = {'model_config': {**MODEL, 'hidden_size': 4},
          'param_shapes': {'a/kernel': [4, 3], 'old': [1]}}
  with pytest.raises(ResumeMismatchError) as e:
    run_record.check_compatible(meta, MODEL, PARAMS, 'W')
  assert str(e.value) == (
      'The checkpoint in W does not match the config; use a fresh --workdir or the config '
      'it was trained with. Differences: model.hidden_size: checkpoint 4, config 8; '
      'param a/kernel: checkpoint shape [4, 3], config shape [2, 3]; '
      'param b: checkpoint shape <absent>, config shape [5]; '
      'param old: checkpoint shape [1], config shape <absent>')


def test_a_long_list_of_differences_is_cut_after_twelve():
  meta = {'model_config': MODEL, 'param_shapes': {f'p{i:02d}': [i] for i in range(12)}}
  # 14 in all (a/kernel and b are absent from the checkpoint): the 12 first, sorted.
  with pytest.raises(ResumeMismatchError, match=r'param p09: checkpoint shape \[9\], config '
                     r'shape <absent>; \.\.\. and 2 more$'):
    run_record.check_compatible(meta, MODEL, PARAMS, 'W')


EXPECTED = {'data': {'name': 'mnist', 'sampling': 'index'}, 'optimizer': {'name': 'adam'},
            'schedule': {'name': 'cosine'}, 'train_steps': 100}


def test_a_different_input_stream_or_optimizer_never_resumes():
  meta = {**EXPECTED, 'step': 7, 'data': {'name': 'mnist'}}   # Recorded before 'sampling'.
  with pytest.raises(ResumeMismatchError) as e:
    run_record.check_resume(meta, EXPECTED, 'W', allow_schedule_change=True)
  assert str(e.value) == (
      "The checkpoint in W was trained on a different input stream: dataset.sampling: "
      "checkpoint '<absent>', config 'index'. (A checkpoint without dataset.sampling read "
      "its data with config.dataset.sampling='stream': set it to resume.) Use a fresh "
      "--workdir.")
  meta = {**EXPECTED, 'step': 7, 'optimizer': {'name': 'sgd'}}
  with pytest.raises(ResumeMismatchError, match=r"^Cannot resume from step 7 in W: the "
                     r"optimizer differs from the checkpoint's: optimizer.name: checkpoint "
                     r"'sgd', config 'adam'\. "):
    run_record.check_resume(meta, EXPECTED, 'W', allow_schedule_change=True)


def test_a_schedule_change_resumes_only_when_allowed_and_is_returned():
  meta = {**EXPECTED, 'step': 7, 'train_steps': 50}
  with pytest.raises(ResumeMismatchError, match=r'^Resuming from step 7 in W would change the '
                     r'learning-rate schedule: train_steps: checkpoint 50, config 100\. '):
    run_record.check_resume(meta, EXPECTED, 'W')
  assert run_record.check_resume(meta, EXPECTED, 'W', allow_schedule_change=True) == [
      'train_steps: checkpoint 50, config 100']
  # What the checkpoint does not record is not compared.
  assert run_record.check_resume({'step': 7}, EXPECTED, 'W') == []


def test_keys_added_later_are_not_recorded_at_their_defaults_so_older_workdirs_resume():
  config = model_config.default_model_config().to_dict()
  record = run_record.without_compute_keys(config, only_defaults=True)
  assert 'dropout_rate' not in record['encoder']['moe']
  assert not {'capacity_ceil_or_round', 'capacity_multiple_of'} & set(
      record['encoder']['moe']['router'])
  assert 'dropout_rate' in config['encoder']['moe']          # the input is not changed
  # A record from before these keys existed matches today's defaults...
  run_record.check_compatible({'model_config': record}, record, {}, 'W')
  # ...and set to another value they are recorded, and compared.
  config['encoder']['moe']['router']['capacity_ceil_or_round'] = 'round'
  changed = run_record.without_compute_keys(config, only_defaults=True)
  assert changed['encoder']['moe']['router']['capacity_ceil_or_round'] == 'round'
  with pytest.raises(errors.ResumeMismatchError,
                     match=r"model.encoder.moe.router.capacity_ceil_or_round: checkpoint "
                     r"'<absent>', config 'round'"):
    run_record.check_compatible({'model_config': record}, changed, {}, 'W')


def test_sparse_ot_implementation_is_not_compared_so_workdirs_from_before_auto_resume():
  """Records from before implementation='auto' hold the default of then, 'fast';
  the key chooses how the plans are computed (the same plans up to rounding), so
  a checkpoint resumes and is evaluated under any value of it."""
  config = model_config.default_model_config()
  assert config.encoder.moe.router.sparse_ot.implementation == 'auto'
  now = run_record.without_compute_keys(config.to_dict(), only_defaults=True)
  assert now['encoder']['moe']['router']['sparse_ot']['implementation'] == 'auto'  # recorded
  old = run_record.without_compute_keys(config.to_dict(), only_defaults=True)
  old['encoder']['moe']['router']['sparse_ot']['implementation'] = 'fast'
  run_record.check_compatible({'model_config': old}, now, {}, 'W')
  assert run_record.model_config_differences(old, config) == []
  config.encoder.moe.router.sparse_ot.gamma = 2.0       # the other options still are
  with pytest.raises(errors.ResumeMismatchError, match=r'sparse_ot.gamma: checkpoint 1.0'):
    run_record.check_compatible(
        {'model_config': old},
        run_record.without_compute_keys(config.to_dict(), only_defaults=True), {}, 'W')


def test_sparse_ot_records_from_before_newton_resume_with_solver_adam_and_not_without():
  """A record from before solver='newton' became the default holds solver 'adam',
  num_steps 50 and no tol. With solver='adam' set (num_steps None: the solver's 50)
  it resumes and evaluates as it was; under the new default it is refused in one
  line naming the key (the routing would change)."""
  config = model_config.default_model_config()
  sparse = config.encoder.moe.router.sparse_ot
  assert (sparse.solver, sparse.num_steps, sparse.tol) == ('newton', None, 1e-6)
  old = run_record.without_compute_keys(config.to_dict(), only_defaults=True)
  old['encoder']['moe']['router']['sparse_ot'].update(solver='adam', num_steps=50)
  assert 'tol' not in old['encoder']['moe']['router']['sparse_ot']   # at its default: left out
  with pytest.raises(errors.ResumeMismatchError, match=r'sparse_ot.solver: checkpoint'):
    run_record.check_compatible(
        {'model_config': old},
        run_record.without_compute_keys(config.to_dict(), only_defaults=True), {}, 'W')
  sparse.solver = 'adam'
  now = run_record.without_compute_keys(config.to_dict(), only_defaults=True)
  run_record.check_compatible({'model_config': old}, now, {}, 'W')
  assert run_record.model_config_differences(old, config) == []


SAVED = {'name': 'vit_moe', 'hidden_size': 16, 'dtype': 'float32',
         'encoder': {'patch': [4, 4], 'moe': {'router': {'name': 'topk', 'k': 1}}}}


def _job_config(**model_changes):
  model = ml_collections.ConfigDict(SAVED)
  model.encoder.patch = (4, 4)      # A tuple in the config, a list in the checkpoint.
  for key, value in model_changes.items():
    model[key] = value
  return ml_collections.ConfigDict({'model': model, 'seed': 3})


def test_differences_name_each_key_with_both_values_and_skip_compute_keys():
  assert run_record.model_config_differences(SAVED, _job_config().model) == []
  # dtype changes how the model computes, not its parameters: not compared.
  assert run_record.model_config_differences(SAVED, _job_config(dtype='bfloat16').model) == []
  config = _job_config(hidden_size=24)
  config.model.encoder.moe.router.name = 'sparse_ot'
  del config.model.encoder.moe.router.k
  assert run_record.model_config_differences(SAVED, config.model) == [
      "model.encoder.moe.router.k: config '<absent>', checkpoint 1",
      "model.encoder.moe.router.name: config 'sparse_ot', checkpoint 'topk'",
      'model.hidden_size: config 24, checkpoint 16']


def test_resolve_keeps_a_matching_config_and_refuses_or_takes_the_checkpoints():
  config = _job_config()
  assert run_record.resolve_model_config(config, {'model_config': SAVED}, use_checkpoint_config=False,
                                 where='step 4') is config
  assert run_record.resolve_model_config(config, {}, use_checkpoint_config=False,   # Old checkpoint.
                                 where='step 4') is config
  other = _job_config(hidden_size=24)
  with pytest.raises(errors.CheckpointMismatchError) as e:
    run_record.resolve_model_config(other, {'model_config': SAVED}, use_checkpoint_config=False,
                            where='step 4')
  assert str(e.value) == (
      'config.model differs from the model config of step 4: model.hidden_size: config 24, '
      "checkpoint 16. Pass --use_checkpoint_config to evaluate with the checkpoint's model "
      'config.')
  resolved = run_record.resolve_model_config(other, {'model_config': SAVED}, use_checkpoint_config=True,
                                     where='step 4')
  assert resolved.model.to_dict() == SAVED and resolved.seed == 3
  assert other.model.hidden_size == 24                 # The input is not changed.
