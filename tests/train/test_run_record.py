"""train.run_record: what a checkpoint records, and the rules for older records."""
import numpy as np
import pytest

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import errors
from vmoe_sparse_ot.train import run_record
from tests.train.helpers import small_config


def test_checkpoints_from_before_dataset_sampling_resume_with_stream():
  # What a checkpoint recorded before config.dataset.sampling existed.
  old = {'data': {'name': 'embedded_mnist', 'split': 'train[:4096]', 'batch_size': 16,
                  'seed': 0, 'shuffle_buffer': 1024}}
  config = small_config('router=sparse_ot', dataset__sampling='stream', seed=0)
  stream = run_record.stream(config.dataset, 16, 0)
  assert stream == old['data']
  checkpoints.check_resume(old, {'data': stream}, 'DIR')
  config = small_config('router=sparse_ot', seed=0)
  index = run_record.stream(config.dataset, 16, 0)
  assert index == {**{k: v for k, v in old['data'].items() if k != 'shuffle_buffer'},
                   'sampling': 'index'}
  with pytest.raises(errors.ResumeMismatchError,
                     match=r"dataset.sampling: checkpoint '<absent>', config 'index'.*"
                     r"config.dataset.sampling='stream': set it to resume"):
    checkpoints.check_resume(old, {'data': index}, 'DIR')


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
