"""evaluate.checkpoint_config: the model config a checkpoint records, against a job's."""
import pytest

from vmoe_sparse_ot.evaluate import checkpoint_config as cc

SAVED = {'name': 'vit_moe', 'hidden_size': 16, 'dtype': 'float32',
         'encoder': {'patch': [4, 4], 'moe': {'router': {'name': 'topk', 'k': 1}}}}


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
