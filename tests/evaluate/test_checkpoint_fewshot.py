"""evaluate.checkpoint_fewshot: the few-shot table of a hand-made payload and the
message for a checkpoint whose parameters do not fit the model (end to end on a
trained checkpoint: tests/test_fewshot.py)."""
import jax
import ml_collections
import numpy as np
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.errors import CheckpointMismatchError
from vmoe_sparse_ot.evaluate import checkpoint_fewshot
from vmoe_sparse_ot.nn.abstract_init import abstract_variables
from tests.nn.helpers import tiny_config

# tiny_config's input: 8x8 RGB images.
CONFIG = ml_collections.ConfigDict({'dataset': {'image_size': 8, 'channels': 3}})


def test_table_names_the_reference_l2_selection():
  shot = {'accuracy_mean': 0.5, 'accuracy_std': 0.0, 'accuracy': [0.5], 'l2_reg': [4.0],
          'seeds': [0]}
  payload = {'workdir': '/w', 'step': 3, 'model': {'name': 'vit_moe', 'router': 'topk'},
             'protocol': {'seeds': (0,), 'l2_selection': 'reference'},
             'datasets': {'digits': {'shots': {5: shot}}}}
  table = checkpoint_fewshot.format_table(payload)
  assert ("L2 chosen by 'reference', the reference V-MoE code's rule: on the test split, "
          'one per shot for every dataset and seed)') in table.splitlines()[0]
  assert table.splitlines()[-1].split() == ['digits', '5', '50.00', '±', '0.00', '2']
  payload['protocol']['l2_selection'] = 'loo'
  assert 'L2 chosen by loo on the few-shot examples' in checkpoint_fewshot.format_table(payload)


def _zeros(model_config):
  """Parameters of `model_config`'s model on CONFIG's images, all zero."""
  shapes = abstract_variables(nn.build_model(model_config), (8, 8, 3))['params']
  return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)


def test_params_that_do_not_fit_the_model_are_named_with_both_shapes():
  model = nn.build_model(tiny_config())
  params = _zeros(tiny_config())
  checkpoint_fewshot.check_params_match(params, model, CONFIG)  # Its own: no error.
  params['head'] = {'kernel': np.zeros((16, 5), np.float32)}      # 5 classes, no bias.
  params['extra'] = np.zeros((2,), np.float32)
  with pytest.raises(CheckpointMismatchError) as e:
    checkpoint_fewshot.check_params_match(params, model, CONFIG)
  assert str(e.value) == (
      'The checkpoint does not fit config.model (was it trained with another config?): '
      'extra: checkpoint [2], model <absent>; head/bias: checkpoint <absent>, model [3]; '
      'head/kernel: checkpoint [16, 5], model [16, 3]')


def test_a_long_list_of_differences_is_cut_after_twenty():
  wider = tiny_config()
  wider.hidden_size = 24
  with pytest.raises(CheckpointMismatchError) as e:
    checkpoint_fewshot.check_params_match(_zeros(wider), nn.build_model(tiny_config()), CONFIG)
  # Of the 40 arrays, D (16 -> 24) and the head size D/2 (8 -> 12) leave 3 alike:
  # the MLP's and the experts' first biases (H = 32) and the head's bias (3 classes).
  parts = str(e.value).split('; ')
  assert len(parts) == 21 and parts[-1] == '... and 17 more'
  assert parts[0].endswith('embedding/bias: checkpoint [24], model [16]')
