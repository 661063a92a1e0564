"""config.files: config-file arguments, the configs' contents and pp strings that follow image_size."""
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
