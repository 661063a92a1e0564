"""config.files: config-file arguments, the configs' contents and pp strings that follow image_size."""
import os
import sys

import pytest

from vmoe_sparse_ot.evaluate import overrides
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.config import cli
from tests.config.helpers import load


def test_tiny_config_defaults_and_router_short_form():
  config = load('vmoe_tiny_mnist.py')
  assert config.dataset.name == 'embedded_mnist'
  assert config.model.encoder.moe.router.name == 'sparse_ot'
  assert load('vmoe_tiny_mnist.py', 'router=sbase').model.encoder.moe.router.name == 'sbase'
  assert load('vmoe_tiny_mnist.py', 'router=topk,steps=7').train_steps == 7
  config_lib.validate(config)
  assert config.fewshot.datasets  # Few-shot keys come from default_fewshot_config().
  # As its README numbers were measured: independent expert init; every router's C is
  # 16 (expert choice counts C from S/E, so its factor is K = 2), expert choice noiseless.
  assert config.model.encoder.moe.split_rngs is True
  for router in ('topk', 'sbase', 'expert_choice'):
    model = load('vmoe_tiny_mnist.py', f'router={router}').model
    assert overrides.capacity(model) == 16
  router = load('vmoe_tiny_mnist.py', 'router=expert_choice').model.encoder.moe.router
  assert (router.capacity_factor, router.noise_std) == (2.0, 0.0)


def test_pp_strings_of_the_configs_follow_image_size():
  """Setting dataset.image_size (a script, or --config.dataset.image_size) moves the resize."""
  config = load('vmoe_tiny_mnist.py')
  assert config.dataset.pp_train == 'decode(channels=1)|resize(28)|value_range(-1, 1)'
  config.dataset.image_size = 35
  assert config.dataset.pp_train == 'decode(channels=1)|resize(35)|value_range(-1, 1)'
  assert config.dataset.pp_eval == config.dataset.pp_train
  config.dataset.pp_eval = 'decode|value_range(0, 1)'   # the user's own string wins
  config.dataset.image_size = 14
  assert config.dataset.pp_eval == 'decode|value_range(0, 1)'
  assert 'resize(14)' in config.dataset.pp_train
  assert cli.format_config(config).count('resize(14)') == 1   # printed resolved
  ft = load('vmoe_b16_ft_imagenet.py')
  ft.dataset.image_size = 512
  assert ft.dataset.pp_train.startswith('decode_jpeg_and_inception_crop(512)|')
  assert ft.dataset.pp_eval == 'decode|resize(512)|value_range(-1, 1)'
  with pytest.raises(KeyError, match='no key'):
    config_lib.pp_template(config.dataset, 'resize({size})')
  assert config_lib.pp_template(config.dataset, 'decode') == 'decode'


def test_configs_are_locked():
  config = load('vmoe_tiny_mnist.py')
  with pytest.raises(AttributeError, match='router'):
    config.model.encoder.moe.routr = {'name': 'topk'}
  with pytest.raises(ValueError, match=r"unknown config argument 'routr'; valid keys: "
                     r"\['router', 'steps'\]"):
    load('vmoe_tiny_mnist.py', 'routr=topk')


def test_config_argument_of_the_wrong_type_names_the_key():
  with pytest.raises(ValueError, match=r"^config argument steps='abc' must be an integer$"):
    load('vmoe_tiny_mnist.py', 'steps=abc')
  with pytest.raises(FileNotFoundError, match=r"^config file '.*nope.py' not found$"):
    load('nope.py')


def test_loading_a_config_writes_no_bytecode_beside_it_or_its_siblings(tmp_path, monkeypatch):
  """A config folder may be read-only or shared: neither the file nor the sibling it
  imports from PYTHONPATH (as the reference's configs import `common`) gets a
  __pycache__, whether or not PYTHONDONTWRITEBYTECODE is set."""
  folder = tmp_path / 'configs'
  folder.mkdir()
  (folder / 'vmoe_test_common_sibling.py').write_text('STEPS = 3\n')
  (folder / 'run.py').write_text(
      'import ml_collections\n'
      'import vmoe_test_common_sibling\n'
      'def get_config():\n'
      '  return ml_collections.ConfigDict({"train_steps": vmoe_test_common_sibling.STEPS})\n')
  monkeypatch.syspath_prepend(str(folder))
  monkeypatch.delitem(sys.modules, 'vmoe_test_common_sibling', raising=False)
  monkeypatch.setattr(sys, 'dont_write_bytecode', False)  # as on a plain Python install
  config = config_lib.load_config_file(str(folder / 'run.py'), translate=False)
  sys.modules.pop('vmoe_test_common_sibling')
  assert config.train_steps == 3
  assert sorted(os.listdir(folder)) == ['run.py', 'vmoe_test_common_sibling.py']
  assert sys.dont_write_bytecode is False  # restored: the user's own imports still cache
