"""config.validation: each bad value is one line naming its key; checks against the
number of devices."""
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot import config as config_lib
from tests.config.helpers import load
from tests.train.helpers import TINY
from tests.train.helpers import unlocked_config


def test_unknown_router_and_bad_sections_fail_clearly():
  config = load('vmoe_tiny_mnist.py', 'router=sinkhorn_magic')
  with pytest.raises(ValueError, match=r"router.name must be one of .*sparse_ot"):
    nn.build_model(config.model)
  config = load('vmoe_tiny_mnist.py')
  config.optimizer.name = 'adagrad'
  with pytest.raises(ValueError, match=r"config.optimizer.name='adagrad': must be one of "
                     r"\['adam', 'adamw', 'sgd', 'adafactor'\]"):
    config_lib.validate(config)
  assert TINY.endswith('vmoe_tiny_mnist.py')


def _set(config, key, value):
  node = config
  *parents, leaf = key.split('.')
  for part in parents:
    node = node[part]
  node[leaf] = value


# (key, bad value, the whole one-line message validate() gives).
BAD_CONFIGS = [
    ('schedule.peak_value', -1e-3, 'config.schedule.peak_value=-0.001: must be > 0'),
    ('schedule.peak_value', 0.0, 'config.schedule.peak_value=0.0: must be > 0'),
    ('schedule.peak_value', float('inf'),
     'config.schedule.peak_value=inf: must be a finite number > 0'),
    ('schedule.end_value', -1e-5, 'config.schedule.end_value=-1e-05: must be >= 0'),
    ('schedule.warmup_steps', -1, 'config.schedule.warmup_steps=-1: must be an integer >= 0'),
    ('schedule.decay_steps', 0,
     'config.schedule.decay_steps=0: must be an integer >= 1 or None'),
    ('schedule.name', 'linear', "config.schedule.name='linear': must be one of "
     "['warmup_linear_decay', 'warmup_cosine_decay', 'warmup_constant', 'constant', "
     "'warmup_polynomial_decay', 'warmup_exponential_decay', 'big_vision_rsqrt']"),
    ('optimizer.gradient_clip_norm', -1.0,
     'config.optimizer.gradient_clip_norm=-1.0: must be > 0 or None'),
    ('optimizer.weight_decay', -0.1, 'config.optimizer.weight_decay=-0.1: must be >= 0'),
    ('optimizer.param_naming', 'vit', "config.optimizer.param_naming='vit': must be one of "
     "['ours', 'vmoe']"),
    ('optimizer.b2', 1.0, 'config.optimizer.b2=1.0: must be in [0, 1)'),
    ('optimizer.eps', 0.0, 'config.optimizer.eps=0.0: must be > 0'),
    ('optimizer.weight_decay_regex', '(kernel',
     "config.optimizer.weight_decay_regex='(kernel': must be a regular expression "
     '(missing ), unterminated subpattern at position 0)'),
    ('model.encoder.moe.router.num_selected_experts', 9,
     'config.model.encoder.moe.router.num_selected_experts=9: must be <= '
     'config.model.encoder.moe.num_experts=8 (K <= E)'),
    ('model.encoder.moe.router.num_selected_experts', 0,
     'config.model.encoder.moe.router.num_selected_experts=0: must be an integer >= 1'),
    ('model.encoder.moe.router.capacity', 65,
     'config.model.encoder.moe.router.capacity=65: must be <= '
     'config.model.encoder.moe.group_size=64 (C <= S) or None'),
    ('model.encoder.moe.router.capacity_factor', 0.0,
     'config.model.encoder.moe.router.capacity_factor=0.0: must be > 0'),
    ('model.encoder.moe.num_experts', 0,
     'config.model.encoder.moe.num_experts=0: must be an integer >= 1'),
    ('model.encoder.moe.group_size', 0,
     'config.model.encoder.moe.group_size=0: must be an integer >= 1'),
    ('model.encoder.moe.split_rngs', None,
     'config.model.encoder.moe.split_rngs=None: must be True or False'),
    ('dataset.image_size', 30, 'config.dataset.image_size=30 must be divisible by '
     'config.model.patch_size=(7, 7)'),
    ('model.encoder.num_heads', 3, 'config.model.hidden_size=64 must be divisible by '
     'config.model.encoder.num_heads=3'),
    ('model.hidden_size', 0, 'config.model.hidden_size=0: must be an integer >= 1'),
    ('model.num_classes', 0, 'config.model.num_classes=0: must be an integer >= 1 or None '
     '(no head: the model returns its representation)'),
    ('model.encoder.dropout_rate', 1.5,
     'config.model.encoder.dropout_rate=1.5: must be in [0, 1)'),
    ('model.encoder.attention_dropout_rate', -0.1,
     'config.model.encoder.attention_dropout_rate=-0.1: must be in [0, 1)'),
    ('model.variant', 'X/16', "config.model.variant='X/16': must be SIZE/PATCH with SIZE in "
     "['Ti', 'S', 'B', 'L', 'H'] (e.g. \"B/32\"), V-MoE-SIZE/PATCH with SIZE in "
     "['S', 'B', 'L', 'H'] (e.g. \"V-MoE-S/32\") or None"),
    ('model.variant', 'V-MoE-Ti/16', "config.model.variant='V-MoE-Ti/16': must be SIZE/PATCH "
     "with SIZE in ['Ti', 'S', 'B', 'L', 'H'] (e.g. \"B/32\"), V-MoE-SIZE/PATCH with SIZE in "
     "['S', 'B', 'L', 'H'] (e.g. \"V-MoE-S/32\") or None"),
    ('model.representation_size', -1,
     'config.model.representation_size=-1: must be an integer >= 0 or None'),
    ('model.classifier', 'cls', "config.model.classifier='cls': must be one of "
     "['token', 'gap', 'map', '0']"),
    ('log_every_steps', 0, 'config.log_every_steps=0: must be an integer >= 1'),
    ('eval_every_steps', -1, 'config.eval_every_steps=-1: must be an integer >= 0'),
    ('train_steps', 0, 'config.train_steps=0: must be an integer >= 1'),
    ('batch_size', -8, 'config.batch_size=-8: must be an integer >= 1'),
    ('checkpoint.keep', 0, 'config.checkpoint.keep=0: must be an integer >= 1'),
    ('checkpoint.every_steps', 0, 'config.checkpoint.every_steps=0: must be an integer >= 1'),
    ('checkpoint.keep_steps_multiple_of', -2,
     'config.checkpoint.keep_steps_multiple_of=-2: must be an integer >= 0'),
    ('dataset.shuffle_buffer', 0, 'config.dataset.shuffle_buffer=0: must be an integer >= 1'),
    ('dataset.channels', 2, 'config.dataset.channels=2: must be one of [1, 3]'),
    ('dataset.sampling', 'grain', "config.dataset.sampling='grain': must be one of "
     "['index', 'stream']"),
    ('dataset.augment', 'mixup', "config.dataset.augment='mixup': must be one of "
     "['none', 'inception_crop_flip'] or None"),
    ('dataset.name', '', "config.dataset.name='': must be a dataset name (an embedded or "
     'TFDS dataset)'),
    ('dataset.pp_train', 'decode|flipp', "config.dataset.pp_train='decode|flipp': unknown op "
     "'flipp'; ops: central_crop, copy, decode, decode_jpeg_and_inception_crop, drop, flatten, "
     'flip_lr, ignore_no_labels, inception_crop, keep, onehot, randaug, random_crop, reshape, '
     'resize, resize_small, value_range'),
    ('dataset.pp_train', 'decode|resize(0)', "config.dataset.pp_train='decode|resize(0)': op "
     "'resize(0)': size=0 must be a positive integer or a pair (height, width); accepts "
     "resize(size, method='bilinear', antialias=False, key='image', key_result=None)"),
    ('dataset.pp_train', 'decode|randaug(2, magnitud=9)',
     "config.dataset.pp_train='decode|randaug(2, magnitud=9)': op 'randaug(2, magnitud=9)': "
     "got an unexpected keyword argument 'magnitud'; accepts randaug(num_layers=2, "
     'magnitude=10, translate_const=100, cutout_const=40, key=\'image\', key_result=None)'),
    ('dataset.pp_train', 'decode|onehot(10, key="label", of=0.1)',
     "config.dataset.pp_train='decode|onehot(10, key=\"label\", of=0.1)': op "
     "'onehot(10, key=\"label\", of=0.1)': got an unexpected keyword argument 'of'; accepts "
     "onehot(depth, key='labels', key_result=None, multi=True, on=1.0, off=0.0)"),
    ('dataset.pp_eval', 'decode|flip_lr|value_range(-1, 1)',
     "config.dataset.pp_eval='decode|flip_lr|value_range(-1, 1)': op 'flip_lr' is random: "
     'evaluation preprocessing must be deterministic (random ops belong in pp_train)'),
    ('dataset.pp_eval', 'decode|resize(28', "config.dataset.pp_eval='decode|resize(28': not "
     "a pp string ('(' was never closed at column 14): ops are written name(arg, "
     'keyword=value) and separated by "|"'),
    ('dataset.pp_eval', '', "config.dataset.pp_eval='': must be a pp string such as "
     '"decode|resize(224)|value_range(-1, 1)" or None'),
    ('dataset.augment', 'none', "config.dataset.pp_train='decode(channels=1)|resize(28)|"
     "value_range(-1, 1)' and config.dataset.augment='none' are both set: augment is the older spelling of "
     'the pp strings; set it to None'),
    ('mesh.expert', 3, 'config.mesh.expert=3 must divide config.model.encoder.moe.num_experts=8'),
    ('mesh.data', 0, 'config.mesh.data=0: must be a positive integer or -1 (as many as fit)'),
    ('fewshot.shots', (0, 5), 'config.fewshot.shots=(0, 5): must be one or more integers >= 1'),
    ('fewshot.batch_size', 0, 'config.fewshot.batch_size=0: must be an integer >= 1'),
    ('peak_flops_per_device', 0.0, 'config.peak_flops_per_device=0.0: must be > 0 or None'),
    ('model.encoder.moe.router.z_loss_weight', -0.1,
     'config.model.encoder.moe.router.z_loss_weight=-0.1: must be >= 0'),
]


@pytest.mark.parametrize('key,value,message', BAD_CONFIGS,
                         ids=[f'{k}={v!r}' for k, v, _ in BAD_CONFIGS])
def test_each_bad_value_gives_one_line_naming_the_key(key, value, message):
  config = load('vmoe_tiny_mnist.py')
  config.unlock()
  _set(config, key, value)
  with pytest.raises(config_lib.ConfigError) as info:
    config_lib.validate(config)
  assert str(info.value) == message


def test_unknown_keys_are_named_in_every_section():
  for section in ('', 'dataset.', 'model.', 'model.encoder.', 'model.encoder.moe.',
                  'fewshot.'):
    config = load('vmoe_tiny_mnist.py').to_dict()
    node = config
    for part in filter(None, section.rstrip('.').split('.')):
      node = node[part]
    node['typo_key'] = 1
    with pytest.raises(ValueError) as info:
      config_lib.validate(config)
    where = ('config.' + section).rstrip('.')
    assert str(info.value).startswith(f"unknown key(s) ['typo_key'] in {where}; valid keys: ")


def test_device_dependent_checks():
  config = load('vmoe_tiny_mnist.py')
  config_lib.validate_for_devices(config, num_devices=4, num_processes=2)
  with pytest.raises(ValueError, match=r'^config.batch_size=128: must be a multiple of the '
                     r'number of devices \(3\) and of processes \(1\)$'):
    config_lib.validate_for_devices(config, num_devices=3)
  config.unlock()
  config.mesh.expert = 4
  with pytest.raises(ValueError, match=r'^config.mesh.expert=4: must divide the number of '
                     r'devices \(2\) or be -1$'):
    config_lib.validate_for_devices(config, num_devices=2)


BAD = [
    ({'loss.name': 'xent'},
     "config.loss.name='xent': must be one of ['softmax_xent', 'sigmoid_xent']"),
    ({'mixup.p': -0.1}, 'config.mixup.p=-0.1: must be >= 0'),
    ({'mixup.alpha': 0.2}, "unknown key(s) ['alpha'] in config.mixup; valid keys: "
     "['granularity', 'p', 'size']"),
    ({'mixup.granularity': 'host'},
     "config.mixup.granularity='host': must be one of ['batch', 'device', 'example']"),
    ({'mixup.size': 1}, 'config.mixup.size=1: must be an integer >= 2'),
    ({'loss.name': 'sigmoid_xent', 'label_smoothing': 0.1},
     "config.label_smoothing=0.1: applies to config.loss.name='softmax_xent' only, not "
     "'sigmoid_xent' (smooth the targets in the pp string: onehot(..., on=, off=))"),
    ({'evaluate.datasets': {'a/b': {'split': 'test'}}},
     "config.evaluate.datasets: name 'a/b' must be letters, digits, '_', '.' or '-' (it "
     'names the metrics eval/NAME/...)'),
    ({'evaluate.datasets': {'val': {'dataset': 'embedded_mnist'}}},
     "config.evaluate.datasets.val.split=None: must be a TFDS split such as \"test\" "
     '(required)'),
    ({'evaluate.datasets': {'val': {'split': 'test', 'labelkey': 'x'}}},
     "unknown key(s) ['labelkey'] in config.evaluate.datasets.val; valid keys: ['dataset', "
     "'label_key', 'pp', 'split']"),
    ({'evaluate.datasets': {'val': {'split': 'test', 'pp': 'decode|flip_lr'}}},
     "config.evaluate.datasets.val.pp='decode|flip_lr': op 'flip_lr' is random: evaluation "
     'preprocessing must be deterministic (random ops belong in pp_train)'),
]


@pytest.mark.parametrize('overrides,message', BAD, ids=[str(o) for o, _ in BAD])
def test_bad_loss_mixup_and_eval_dataset_values_are_one_line(overrides, message):
  with pytest.raises(ValueError) as info:
    config_lib.validate(unlocked_config(**overrides))
  assert str(info.value) == message
