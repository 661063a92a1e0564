"""config.cli: override typos name the valid keys; a user's error is one line, exit status 2."""
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.config import cli
from tests.config.helpers import load


def test_override_typo_names_valid_keys():
  config = load('vmoe_tiny_mnist.py')
  message = config_lib.explain_override(
      config, ['--config.model.encoder.moe.router.name=topk',
               '--config.model.encoder.moe.routr.name=topk'])
  assert "Unknown config key 'routr'" in message
  assert 'valid keys under config.model.encoder.moe:' in message
  for key in ('dispatcher', 'group_size', 'layers', 'num_experts', 'router'):
    assert key in message
  assert config_lib.explain_override(config, ['--config.seed=3']) is None


def test_negative_topk_bias_update_rate_is_one_line_with_exit_status_2(capsys):
  config = load('vmoe_tiny_mnist.py', 'router=topk_bias')
  config.model.encoder.moe.router.topk_bias.update_rate = -1.0
  with pytest.raises(ValueError) as error:
    nn.build_model(config.model)   # As the training command line's checks do.
  with pytest.raises(SystemExit) as info:
    cli.fail('python -m vmoe_sparse_ot.main', error.value)
  assert info.value.code == 2
  assert capsys.readouterr().err == (
      'python -m vmoe_sparse_ot.main: error: model.encoder.moe.router.topk_bias.update_rate '
      'must be >= 0, got -1.0\n')


@pytest.mark.parametrize('edit, check, line', [
    (lambda c: c.model.encoder.__setattr__('position_emb', 'rope'), 'validate',
     "config.model.encoder.position_emb='rope': must be one of ['learned', 'sincos2d', "
     "'none']"),
    (lambda c: c.model.__setattr__('num_classes', None), 'validate',
     'config.model.num_classes=None: training needs a head'),
    (lambda c: c.model.encoder.moe.router.__setattr__('name', 'topk'), 'build_model',
     'model.encoder.moe.router.soft_moe.num_slots applies to the soft_moe router only'),
])
def test_bad_soft_moe_recipe_values_are_one_line_with_exit_status_2(edit, check, line,
                                                                     capsys):
  from vmoe_sparse_ot.config.validation import validate  # pylint: disable=g-import-not-at-top
  config = load('softmoe_tiny_mnist.py')
  edit(config)
  with pytest.raises(ValueError) as error:
    validate(config) if check == 'validate' else nn.build_model(config.model)
  with pytest.raises(SystemExit) as info:
    cli.fail('python -m vmoe_sparse_ot.main', error.value)
  err = capsys.readouterr().err
  assert info.value.code == 2 and err.count('\n') == 1
  assert err.startswith('python -m vmoe_sparse_ot.main: error: ' + line), err


def _refused_in_one_line(config, line, capsys):
  """`config` fails validation, and the command line prints `line` alone, exit status 2."""
  with pytest.raises(ValueError) as error:
    config_lib.validate(config)
  with pytest.raises(SystemExit) as info:
    cli.fail('python -m vmoe_sparse_ot.main', error.value)
  err = capsys.readouterr().err
  assert info.value.code == 2 and err == f'python -m vmoe_sparse_ot.main: error: {line}\n'


@pytest.mark.parametrize('key, value, line', [
    ('peak_flops_per_device', -1.0, 'config.peak_flops_per_device=-1.0: must be > 0 or None'),
    ('z_loss_weight', float('nan'), 'config.model.encoder.moe.router.z_loss_weight=nan: '
     'must be a finite number >= 0'),
])
def test_bad_compute_and_z_loss_values_are_one_line_with_exit_status_2(key, value, line,
                                                                       capsys):
  config = load('vmoe_tiny_mnist.py')
  (config if key == 'peak_flops_per_device' else config.model.encoder.moe.router)[key] = value
  _refused_in_one_line(config, line, capsys)


@pytest.mark.parametrize('router, line', [
    ('expert_choice', "config.model.encoder.moe.dispatcher='dropless': needs a token-choice "
     "router (topk, sbase, topk_bias, sparse_ot with form='token_choice'); router "
     "'expert_choice' here does not choose per token"),
    ('topk', "config.model.encoder.moe.num_shared_experts=-1: must be an integer >= 0"),
])
def test_dropless_with_expert_choice_and_negative_shared_experts_are_one_line_exit_2(
    router, line, capsys):
  config = load('vmoe_tiny_mnist.py', f'router={router}')
  config.model.encoder.moe.dispatcher = 'dropless'
  if router == 'topk':
    config.model.encoder.moe.num_shared_experts = -1
  _refused_in_one_line(config, line, capsys)
