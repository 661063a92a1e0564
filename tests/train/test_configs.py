"""Configs: contents, locking, short-form arguments, and clear failures."""
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.evaluate import overrides
from vmoe_sparse_ot.nn.model_config import variant_sizes
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.config import cli
from tests.train.helpers import ROOT, TINY


def load(name, arg=None):
  path = str(ROOT / 'configs' / name)
  return config_lib.load_config_file(f'{path}:{arg}' if arg else path)


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


@pytest.mark.parametrize('name,patch', [('vmoe_b32.py', 32), ('vmoe_b16.py', 16)])
def test_paper_configs_match_the_paper(name, patch):
  config = load(name)
  m = config.model
  assert m.patch_size == (patch, patch) and m.hidden_size == 768
  assert m.encoder.num_layers == 12 and m.encoder.mlp_dim == 3072
  # The V-MoE-B sizes (as model.variant='V-MoE-B/P' sets them), pre-logits of size D.
  sizes = variant_sizes(f'V-MoE-B/{patch}')
  assert (m.hidden_size, m.encoder.num_layers, m.encoder.num_heads, m.encoder.mlp_dim,
          m.patch_size, m.representation_size) == tuple(
              sizes[k] for k in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim',
                                 'patch_size', 'representation_size'))
  assert m.encoder.moe.layers == 'every_2' and m.encoder.moe.num_experts == 32
  router = m.encoder.moe.router
  assert router.name == 'sparse_ot' and router.num_selected_experts == 2
  # V-MoE recipe: groups of 8 images, capacity factor 1.05; the paper's k = 16.
  assert m.encoder.moe.group_size == 8 * ((224 // patch) ** 2 + 1)
  assert router.capacity is None and router.capacity_factor == 1.05
  assert router.sparse_ot.k == 16
  # The reference's defaults: experts initialized alike, gate noise 1/E (noise_std 1).
  assert m.encoder.moe.split_rngs is False and router.noise_std == 1.0
  assert (m.encoder.moe.dispatcher, m.encoder.moe.routed_tokens_dtype) == ('einsum', 'bfloat16')
  assert router.sparse_ot.form == 'expert_choice'
  assert (router.sparse_ot.solver, router.sparse_ot.num_steps,
          router.sparse_ot.learning_rate) == ('adam', 50, 1e-2)
  assert config.optimizer.name == 'adam' and config.optimizer.weight_decay == 0.1
  assert config.schedule.name == 'warmup_linear_decay'
  assert config.schedule.warmup_steps == 10_000
  assert config.batch_size == 4096 and config.dataset.name == 'imagenet2012'
  assert m.num_classes == 1000
  assert load(name, 'dataset=imagenet21k').model.num_classes == 21_843
  config_lib.validate(config)
  nn.build_model(m)


def test_configs_are_locked():
  config = load('vmoe_tiny_mnist.py')
  with pytest.raises(AttributeError, match='router'):
    config.model.encoder.moe.routr = {'name': 'topk'}
  with pytest.raises(ValueError, match=r"unknown config argument 'routr'; valid keys: "
                     r"\['router', 'steps'\]"):
    load('vmoe_tiny_mnist.py', 'routr=topk')


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


@pytest.mark.parametrize('name', ['vmoe_b32.py', 'vmoe_b16.py'])
def test_paper_configs_one_step_dry_run_shrunken(name, tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import trainer  # pylint: disable=g-import-not-at-top
  config = load(name)
  m = config.model
  # Shrink sizes, keep the structure (Every-2 MoE, K=2, capacity, router, optimizer).
  m.hidden_size, m.representation_size = 32, 32
  m.encoder.num_layers, m.encoder.num_heads, m.encoder.mlp_dim = 2, 2, 64
  m.encoder.moe.num_experts, m.encoder.moe.group_size = 4, 8
  m.encoder.moe.router.capacity = 4
  m.encoder.moe.router.sparse_ot.num_steps = 5
  # An embedded dataset stands in for ImageNet (natural-image path: crop and flip).
  config.dataset.name, config.dataset.data_dir = 'sklearn_digits', None
  config.dataset.train_split, config.dataset.eval_split = 'train', 'test[:16]'
  config.dataset.image_size, config.dataset.shuffle_buffer = 32, 64
  config.batch_size, config.eval_batch_size, config.train_steps = 8, 8, 1
  config.fewshot.every_steps = 0
  summary = trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  assert summary['step'] == 1 and len(summary['losses']) == 1
  assert summary['eval']['num_examples'] == 16


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
    ('model.num_classes', 0, 'config.model.num_classes=0: must be an integer >= 1'),
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
     "['token', 'gap']"),
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


def test_directory_checks(tmp_path):
  regular = tmp_path / 'file'
  regular.write_text('')
  config_lib.check_directory(str(tmp_path / 'new' / 'dir'), '--workdir')
  with pytest.raises(ValueError, match=rf"^--workdir='{regular}/w': '{regular}' is a file, "
                     r'not a directory$'):
    config_lib.check_directory(str(regular / 'w'), '--workdir')
  with pytest.raises(ValueError, match='exists and is not a directory'):
    config_lib.check_directory(str(regular), 'config.dataset.data_dir')


def test_one_key_checker_and_schema_constants_match_the_code_they_mirror():
  from vmoe_sparse_ot import config_keys  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.data import pipeline  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.data import __main__ as data_cli  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.data import embedded  # pylint: disable=g-import-not-at-top
  assert config_lib.check_keys is config_keys.check_keys
  assert config_lib.AUGMENTATIONS == pipeline.AUGMENTATIONS
  assert config_lib.SAMPLINGS == pipeline.SAMPLINGS
  assert tuple(sorted(embedded.BUILDERS)) == data_cli.NAMES
  from vmoe_sparse_ot.config import validation  # pylint: disable=g-import-not-at-top
  assert validation.MODELS == tuple(nn.MODELS)


def test_config_argument_of_the_wrong_type_names_the_key():
  with pytest.raises(ValueError, match=r"^config argument steps='abc' must be an integer$"):
    load('vmoe_tiny_mnist.py', 'steps=abc')
  with pytest.raises(FileNotFoundError, match=r"^config file '.*nope.py' not found$"):
    load('nope.py')


def test_finetune_config_is_the_reference_recipe():
  config = load('vmoe_b16_ft_imagenet.py', 'init=/ckpt/vmoe_b16,data_dir=/data')
  m = config.model
  assert (m.hidden_size, m.encoder.num_layers, m.encoder.mlp_dim, m.patch_size) == (
      768, 12, 3072, (16, 16))
  assert m.encoder.moe.num_experts == 8 and m.encoder.moe.router.num_selected_experts == 2
  assert m.encoder.moe.group_size == 8 * (24 * 24 + 1) and m.representation_size is None
  assert m.encoder.moe.router.capacity_factor == 1.5 and m.num_classes == 1000
  assert config.dataset.image_size == 384 and config.batch_size == 1024
  assert config.dataset.pp_train == (
      'decode_jpeg_and_inception_crop(384)|flip_lr|value_range(-1, 1)')
  assert config.dataset.pp_eval == 'decode|resize(384)|value_range(-1, 1)'
  assert config.train_steps == 10_000 and config.initialization.path == '/ckpt/vmoe_b16'
  o, s = config.optimizer, config.schedule
  assert (o.name, o.momentum, o.gradient_clip_norm, o.weight_decay) == ('sgd', 0.9, 10.0, 0.0)
  assert (s.name, s.peak_value, s.warmup_steps, s.end_value) == (
      'warmup_cosine_decay', 0.003, 500, 1e-5)
  config_lib.validate(config)


def test_finetune_config_one_step_dry_run_from_a_reference_checkpoint(tmp_path, caplog):
  """Shrunken: a 'released' V-MoE at 16 px with 21 classes, in the reference's partitioned
  format, fine-tuned at 32 px on 10 classes: zoom and new head by default, one step."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot import initialization  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import trainer  # pylint: disable=g-import-not-at-top
  from tests.initialization.test_partitioned import build, dump  # pylint: disable=g-import-not-at-top

  def shrink(config, image_size, num_classes):
    m = config.model
    m.hidden_size, m.patch_size, m.num_classes = 32, (8, 8), num_classes
    m.encoder.num_layers, m.encoder.num_heads, m.encoder.mlp_dim = 2, 2, 64
    m.encoder.moe.num_experts, m.encoder.moe.group_size = 4, 8
    config.dataset.image_size = image_size
    config.dataset.pp_train = (f'decode_jpeg_and_inception_crop({image_size})|flip_lr|'
                               'value_range(-1, 1)')  # PNG digits: decoded, then cropped.
    config.dataset.pp_eval = f'decode|resize({image_size})|value_range(-1, 1)'
    return config

  upstream = shrink(load('vmoe_b16_ft_imagenet.py'), 16, 21)
  model = nn.build_model(upstream.model)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False)['params'],
                          jax.ShapeDtypeStruct((1, 16, 16, 3), np.float32))
  rng = np.random.default_rng(0)
  ref = {initialization.from_ours(k, 'vmoe'): (0.1 * rng.normal(size=v.shape)).astype(np.float32)
         for k, v in initialization.flatten_tree(shapes).items()}
  dump(str(tmp_path / 'vmoe_b16'), *build(ref, {k: [(tuple((0, d) for d in v.shape), 0)]
                                                for k, v in ref.items()}, 1))

  config = shrink(load('vmoe_b16_ft_imagenet.py', f'init={tmp_path}/vmoe_b16,steps=1'), 32, 10)
  config.dataset.name, config.dataset.data_dir = 'sklearn_digits', None
  config.dataset.train_split, config.dataset.eval_split = 'train', 'test[:16]'
  config.dataset.shuffle_buffer = 64
  config.batch_size, config.eval_batch_size = 8, 8
  config_lib.check_before_training(config, str(tmp_path / 'w'))
  with caplog.at_level('INFO'):
    summary = trainer.train_and_evaluate(config, str(tmp_path / 'w'), devices=jax.devices()[:1])
  assert summary['step'] == 1 and np.isfinite(summary['losses'][0])
  assert 'position embedding resized from a 2x2 to a 4x4 patch grid' in caplog.text
  assert 'head re-initialized' in caplog.text
  assert f'Initialized {len(ref) - 2} of {len(ref)} parameters' in caplog.text


def test_model_overrides_that_change_parameters_are_refused_before_training():
  """check_before_training's check of config.evaluate.model_overrides (`nn.overrides`)."""
  from vmoe_sparse_ot.config.validation import check_model_overrides
  config = load('vmoe_tiny_mnist.py')
  check_model_overrides(config)               # {}: nothing to check, nothing traced
  config.evaluate.model_overrides = {'encoder': {'mlp_dim': 64}}
  with pytest.raises(config_lib.ConfigError, match=r"^config.evaluate.model_overrides."
                     r"encoder.mlp_dim=64 changes the model's parameters \("):
    check_model_overrides(config)
