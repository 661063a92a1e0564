"""evaluate.checkpoint_config: the model config a checkpoint records, against a job's."""
import ml_collections
import pytest

from vmoe_sparse_ot.evaluate import checkpoint_config as cc

SAVED = {'name': 'vit_moe', 'hidden_size': 16, 'dtype': 'float32',
         'encoder': {'patch': [4, 4], 'moe': {'router': {'name': 'topk', 'k': 1}}}}


def _config(**model_changes):
  model = ml_collections.ConfigDict(SAVED)
  model.encoder.patch = (4, 4)      # A tuple in the config, a list in the checkpoint.
  for key, value in model_changes.items():
    model[key] = value
  return ml_collections.ConfigDict({'model': model, 'seed': 3})


def test_differences_name_each_key_with_both_values_and_skip_compute_keys():
  assert cc.model_config_differences(SAVED, _config().model) == []
  # dtype changes how the model computes, not its parameters: not compared.
  assert cc.model_config_differences(SAVED, _config(dtype='bfloat16').model) == []
  config = _config(hidden_size=24)
  config.model.encoder.moe.router.name = 'sparse_ot'
  del config.model.encoder.moe.router.k
  assert cc.model_config_differences(SAVED, config.model) == [
      "model.encoder.moe.router.k: config '<absent>', checkpoint 1",
      "model.encoder.moe.router.name: config 'sparse_ot', checkpoint 'topk'",
      'model.hidden_size: config 24, checkpoint 16']


def test_resolve_keeps_a_matching_config_and_refuses_or_takes_the_checkpoints():
  config = _config()
  assert cc.resolve_model_config(config, {'model_config': SAVED}, use_checkpoint_config=False,
                                 where='step 4') is config
  assert cc.resolve_model_config(config, {}, use_checkpoint_config=False,   # Old checkpoint.
                                 where='step 4') is config
  other = _config(hidden_size=24)
  with pytest.raises(cc.CheckpointMismatchError) as e:
    cc.resolve_model_config(other, {'model_config': SAVED}, use_checkpoint_config=False,
                            where='step 4')
  assert str(e.value) == (
      'config.model differs from the model config of step 4: model.hidden_size: config 24, '
      "checkpoint 16. Pass --use_checkpoint_config to evaluate with the checkpoint's model "
      'config.')
  resolved = cc.resolve_model_config(other, {'model_config': SAVED}, use_checkpoint_config=True,
                                     where='step 4')
  assert resolved.model.to_dict() == SAVED and resolved.seed == 3
  assert other.model.hidden_size == 24                 # The input is not changed.


def test_describe_model_names_the_router_of_a_moe_model_only():
  assert cc.describe_model(SAVED) == {'name': 'vit_moe', 'router': 'topk'}
  assert cc.describe_model({'name': 'vit'}) == {'name': 'vit', 'router': None}


def test_read_meta_names_the_flag_when_there_is_nothing_to_read(tmp_path):
  with pytest.raises(ValueError, match=r"^--workdir='.*nowhere': not a directory$"):
    cc.read_checkpoint_meta(str(tmp_path / 'nowhere'))
  with pytest.raises(ValueError, match=r'^--workdir=.*: '):
    cc.read_checkpoint_meta(str(tmp_path))
  with pytest.raises(ValueError, match=r'^--step=3: '):
    cc.read_checkpoint_meta(str(tmp_path), 3)
