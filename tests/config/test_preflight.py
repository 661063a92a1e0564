"""config.preflight: the disk and the datasets' traced pp output, one line naming the key."""
import pytest

from vmoe_sparse_ot import config as config_lib
from tests.config.helpers import load
from tests.train.helpers import ONEHOT
from tests.train.helpers import PP
from tests.train.helpers import unlocked_config


def test_pp_strings_are_traced_against_the_model_input_before_training():
  config = load('vmoe_tiny_mnist.py')
  config_lib.check_datasets(config)  # The defaults fit.
  config.unlock()
  for key, value, message in [
      ('pp_train', 'decode(channels=1)|central_crop(21)|value_range(-1, 1)',
       "config.dataset.pp_train: pp 'decode(channels=1)|central_crop(21)|value_range(-1, 1)' "
       "gives 'image' float32 of shape (21, 21, 1); the model reads float32 (28, 28, 1)"),
      ('pp_train', 'decode(channels=1)', "gives 'image' uint8 of shape (None, None, 1)"),
      ('pp_eval', "decode(channels=1)|value_range(-1, 1)|keep('image')",
       "config.dataset.pp_eval: pp \"decode(channels=1)|value_range(-1, 1)|keep('image')\" "
       "leaves no integer 'label' (entries: image); the trainer reads it"),
  ]:
    config.dataset[key] = value
    with pytest.raises(config_lib.ConfigError) as info:
      config_lib.check_datasets(config)
    assert str(info.value).startswith('config.dataset.pp_') and message in str(info.value)
    assert '\n' not in str(info.value)
    config.dataset[key] = 'decode(channels=1)|value_range(-1, 1)'


def test_the_fewshot_pp_is_traced_on_every_fewshot_dataset():
  config = load('vmoe_tiny_mnist.py')
  config.unlock()
  config.fewshot.pp = 'decode(1)|resize(32)|central_crop(28)|value_range(-1, 1)|keep("image", "label")'
  config_lib.check_datasets(config, training=False, fewshot=True)  # MNIST and digits fit.
  for pp, message in [
      ('decode(1)|resize(32)|value_range(-1, 1)',
       "config.fewshot.pp (on config.fewshot.datasets.digits): pp 'decode(1)|resize(32)|"
       "value_range(-1, 1)' gives 'image' float32 of shape (32, 32, 1); the model reads "
       "float32 (28, 28, 1)"),
      ('decode(1)|resize(28)|value_range(-1, 1)|keep("image")',
       "config.fewshot.pp='decode(1)|resize(28)|value_range(-1, 1)|keep(\"image\")': must "
       "keep the integer 'label'")]:
    config.fewshot.pp = pp
    with pytest.raises(config_lib.ConfigError) as info:
      config_lib.check_datasets(config, training=False, fewshot=True)
    assert str(info.value).startswith(message) and '\n' not in str(info.value)
  config.fewshot.pp = 'decode(1)|bogus_op'
  with pytest.raises(config_lib.ConfigError, match=r"^config.fewshot.pp='decode\(1\)\|bogus_op'"):
    config_lib.validate(config)


def test_directory_checks(tmp_path):
  regular = tmp_path / 'file'
  regular.write_text('')
  config_lib.check_directory(str(tmp_path / 'new' / 'dir'), '--workdir')
  with pytest.raises(ValueError, match=rf"^--workdir='{regular}/w': '{regular}' is a file, "
                     r'not a directory$'):
    config_lib.check_directory(str(regular / 'w'), '--workdir')
  with pytest.raises(ValueError, match='exists and is not a directory'):
    config_lib.check_directory(str(regular), 'config.dataset.data_dir')


TRACED = [
    ({'mixup.p': 0.2}, "config.mixup.p=0.2: mixup needs one-hot 'labels' float32 (10,) from "
     'config.dataset.pp_train'),
    ({'loss.name': 'sigmoid_xent', 'dataset.pp_train': ONEHOT},
     "config.loss.name='sigmoid_xent': needs one-hot or multi-hot 'labels' float32 (10,) from "
     'config.dataset.pp_eval'),
    ({'dataset.pp_train': f"{PP}|onehot(12, key='label', key_result='labels')"},
     'config.dataset.pp_train: pp "decode(channels=1)|value_range(-1, 1)|onehot(12, '
     "key='label', key_result='labels')\" gives 'labels' float32 of shape (12,); the loss "
     'reads float32 (10,) (config.model.num_classes=10)'),
    ({'evaluate.datasets': {'val': {'split': 'valid'}}},
     "config.evaluate.datasets.val: dataset 'embedded_mnist' has no split 'valid'"),
    ({'evaluate.datasets': {'val': {'split': 'test', 'label_key': 'real_label'}}},
     "config.evaluate.datasets.val: dataset 'embedded_mnist' has no feature 'real_label' "
     '(features: image, label)'),
    ({'evaluate.datasets': {'val': {'split': 'test', 'pp': f"{PP}|keep('image')"}}},
     "config.evaluate.datasets.val.pp: pp \"decode(channels=1)|value_range(-1, 1)|"
     "keep('image')\" leaves no integer 'label' (entries: image)"),
]


@pytest.mark.parametrize('overrides,message', TRACED, ids=[str(o) for o, _ in TRACED])
def test_pp_output_that_the_loss_cannot_read_is_one_line_before_training(overrides, message):
  config = unlocked_config(**overrides)
  config_lib.validate(config)
  with pytest.raises(ValueError) as info:
    config_lib.check_datasets(config)
  assert str(info.value).startswith(message) and '\n' not in str(info.value)


def test_model_overrides_that_change_parameters_are_refused_before_training():
  """check_before_training's check of config.evaluate.model_overrides (`nn.overrides`)."""
  from vmoe_sparse_ot.config.preflight import check_model_overrides
  config = load('vmoe_tiny_mnist.py')
  check_model_overrides(config)               # {}: nothing to check, nothing traced
  config.evaluate.model_overrides = {'encoder': {'mlp_dim': 64}}
  with pytest.raises(config_lib.ConfigError, match=r"^config.evaluate.model_overrides."
                     r"encoder.mlp_dim=64 changes the model's parameters \("):
    check_model_overrides(config)
