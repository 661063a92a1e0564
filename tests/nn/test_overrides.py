"""nn.overrides: model keys replaced over a model config, and the parameters they keep."""
import pytest

from vmoe_sparse_ot.nn import overrides
from tests.nn.helpers import tiny_config

WHERE = 'config.evaluate.model_overrides'


def _router(**keys):
  return {'encoder': {'moe': {'router': keys}}}


def test_routing_keys_keep_the_parameters_and_change_only_those_keys():
  cfg = tiny_config()
  new = overrides.same_variables_model_config(
      cfg, _router(capacity_factor=4.0, num_selected_experts=1, name='expert_choice'),
      (8, 8, 3), WHERE)
  base = cfg.to_dict()
  router = new['encoder']['moe'].pop('router')
  assert router == {**base['encoder']['moe'].pop('router'), 'capacity_factor': 4.0,
                    'num_selected_experts': 1, 'name': 'expert_choice'}
  assert new == base
  assert cfg.encoder.moe.router.capacity_factor == 1.0        # the input is not changed


@pytest.mark.parametrize('update, message', [
    ({'encoder': {'moe': {'num_experts': 8}}},
     r"^config.evaluate.model_overrides.encoder.moe.num_experts=8 changes the model's "
     r"parameters \(params/encoder/encoderblock_1/moe/experts/wi_bias: \[4, 32\] -> \[8, 32\]"),
    # Of two keys, the one that changes shapes is named.
    (_router(capacity_factor=2.0, name='soft_moe'),
     r"^config.evaluate.model_overrides.encoder.moe.router.name='soft_moe' changes"),
    ({'encoder': {'moe': {'routerx': 1}}},
     r"^config.evaluate.model_overrides.encoder.moe.routerx: the model config has no such "
     r"key; valid here: dispatcher, dropout_rate, group_size"),
    (_router(capacity_factor=-1.0),
     r"^config.evaluate.model_overrides: model.encoder.moe.router.capacity_factor must be "
     r"> 0, got -1.0$"),
    ({'hidden_size': {'a': 1}},
     r"^config.evaluate.model_overrides.hidden_size is a value in the model config"),
])
def test_what_changes_parameters_or_is_not_a_model_key_is_one_line_naming_it(update, message):
  with pytest.raises(ValueError, match=message) as e:
    overrides.same_variables_model_config(tiny_config(), update, (8, 8, 3), WHERE)
  assert '\n' not in str(e.value)
