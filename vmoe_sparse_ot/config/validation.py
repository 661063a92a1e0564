"""The value checks of a training config: pure, nothing read from disk, nothing traced.

`validate(config)` checks key names, types, ranges and divisibility that the
config alone decides; `validate_for_devices(config, num_devices, num_processes)`
adds what depends on the number of devices and processes (batch and mesh
divisibility). Each failure is a `ConfigError` (a ValueError) with a one-line
message naming the full key, the value and what is allowed, e.g.

  config.schedule.peak_value=-0.001: must be > 0

The checks that the model and the routers own (every model option's, defined
with it in `nn.model_options`; the routers' shared options, each by its
`check=`) are theirs, in `nn`, called from here and worded as above. A
router's own section is checked by the router when the model is built
(`nn.build_model`), which the command lines call right after these checks. What
needs the disk, the datasets or a traced model is in `config.preflight`.
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping

from vmoe_sparse_ot import initialization
from vmoe_sparse_ot.config_keys import check_keys
from vmoe_sparse_ot.data import pp as pp_lib
from vmoe_sparse_ot.config import fewshot_section as fewshot_config
from vmoe_sparse_ot.data import pp as pp_lib
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.model_options import check_model_options
from vmoe_sparse_ot.nn.variants import variant_sizes
from vmoe_sparse_ot.nn.routers.base import OptionError
from vmoe_sparse_ot.config.schema import AUGMENTATIONS
from vmoe_sparse_ot.config.schema import EVAL_DATASET_KEYS
from vmoe_sparse_ot.config.schema import LOSSES
from vmoe_sparse_ot.config.schema import MIXUP_GRANULARITIES
from vmoe_sparse_ot.config.schema import OPTIMIZERS
from vmoe_sparse_ot.config.schema import PARAM_NAMINGS
from vmoe_sparse_ot.config.schema import SAMPLINGS
from vmoe_sparse_ot.config.schema import SCHEDULES
from vmoe_sparse_ot.config.schema import base_config
from vmoe_sparse_ot.values import is_int

# Sections whose keys are checked against `base_config()`; 'model.encoder.moe.router'
# is left to the router (its options depend on the router).
_SECTIONS = ('', 'dataset', 'optimizer', 'schedule', 'mesh', 'checkpoint', 'model',
             'model.encoder', 'model.encoder.moe', 'initialization', 'loss', 'mixup',
             'evaluate', 'profile')
# A config.evaluate.datasets name becomes part of metric names (eval/NAME/loss).
_EVAL_NAME = re.compile(r'[A-Za-z0-9_.-]+')


class ConfigError(ValueError):
  """A config value is not allowed; the message is one line naming the key."""


def _get(config: Mapping[str, Any], key: str) -> Any:
  node = config
  for part in key.split('.'):
    node = node[part]
  return node


def _fail(key: str, value: Any, allowed: str) -> None:
  raise ConfigError(f'config.{key}={value!r}: {allowed}')


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _int(config, key: str, minimum: int | None = None, *, optional: bool = False) -> None:
  value = _get(config, key)
  if optional and value is None:
    return
  if not is_int(value):
    _fail(key, value, 'must be an integer' + (' or None' if optional else ''))
  if minimum is not None and value < minimum:
    _fail(key, value, f'must be an integer >= {minimum}' + (' or None' if optional else ''))


def _number(config, key: str, *, low: float | None = None, high: float | None = None,
            low_open: bool = False, high_open: bool = False, optional: bool = False) -> None:
  value = _get(config, key)
  if optional and value is None:
    return
  lo = '' if low is None else ('(' if low_open else '[') + f'{low:g}'
  hi = '' if high is None else f'{high:g}' + (')' if high_open else ']')
  if low is not None and high is None:
    allowed = f'must be {">" if low_open else ">="} {low:g}'
  elif high is not None and low is None:
    allowed = f'must be {"<" if high_open else "<="} {high:g}'
  elif low is not None:
    allowed = f'must be in {lo}, {hi}'
  else:
    allowed = 'must be a number'
  if optional:
    allowed += ' or None'
  if not _is_number(value) or not math.isfinite(value):
    _fail(key, value, 'must be a finite number' + (allowed[len('must be'):]
                                                   if low is not None or high is not None else ''))
  if low is not None and (value < low or (low_open and value == low)):
    _fail(key, value, allowed)
  if high is not None and (value > high or (high_open and value == high)):
    _fail(key, value, allowed)


def _choice(config, key: str, choices, *, optional: bool = False) -> None:
  value = _get(config, key)
  if optional and value is None:
    return
  if value not in choices:
    _fail(key, value, f'must be one of {list(choices)}' + (' or None' if optional else ''))


def model_sizes(model: Mapping[str, Any]) -> tuple[int, int, tuple[int, int]]:
  """(hidden_size, num_heads, patch_size) in effect: `model.variant` overrides the keys."""
  variant = model.get('variant')
  if variant is not None:
    sizes = _owned(variant_sizes, variant)
    return sizes['hidden_size'], sizes['num_heads'], sizes['patch_size']
  patch = model['patch_size']
  patch = (patch, patch) if is_int(patch) else tuple(patch)
  if len(patch) != 2 or not all(is_int(p) and p >= 1 for p in patch):
    _fail('model.patch_size', model['patch_size'], 'must be a positive integer or a pair')
  return model['hidden_size'], model['encoder']['num_heads'], patch


def _owned(check, *args):
  """`check(*args)`, a check that `nn` owns, its `OptionError` worded as ours."""
  try:
    return check(*args)
  except OptionError as e:
    _fail(e.key, e.value, e.allowed)


def _validate_model(config) -> None:
  # Each model option and the routers' shared options are checked by their
  # owners in `nn`; here, what spans sections or is training's own.
  _owned(check_model_options, config['model'])
  if config['model']['num_classes'] is None:
    _fail('model.num_classes', None, 'training needs a head: set the number of classes '
          '(None builds a backbone without one, for nn.build_model and initialization)')
  hidden, heads, patch = model_sizes(config['model'])
  if hidden % heads:
    raise ConfigError(f'config.model.hidden_size={hidden} must be divisible by '
                      f'config.model.encoder.num_heads={heads}')
  image_size = config['dataset']['image_size']
  if image_size % patch[0] or image_size % patch[1]:
    raise ConfigError(f'config.dataset.image_size={image_size} must be divisible by '
                      f'config.model.patch_size={tuple(patch)}')
  if config['model']['name'] != 'vit_moe':
    return
  router = config['model']['encoder']['moe']['router']
  num_experts = config['model']['encoder']['moe']['num_experts']
  group_size = config['model']['encoder']['moe']['group_size']
  where = routers.WHERE
  _owned(routers.check_top_level_options, router)
  # What no single option can check: K and C against the MoE layer's E and S.
  if router.get('num_selected_experts', 1) > num_experts:
    _fail(f'{where}.num_selected_experts', router['num_selected_experts'],
          f'must be <= config.model.encoder.moe.num_experts={num_experts} (K <= E)')
  if router.get('capacity') is not None and router['capacity'] > group_size:
    _fail(f'{where}.capacity', router['capacity'],
          f'must be <= config.model.encoder.moe.group_size={group_size} (C <= S) or None')


def _validate_pp(config) -> None:
  """The pp strings parse, name known ops with valid arguments; eval's is deterministic.

  Pure Python (no TensorFlow): the ops' output is checked in `preflight.check_datasets`.
  """
  dataset = config['dataset']
  for key, training in (('pp_train', True), ('pp_eval', False)):
    value = dataset[key]
    if value is None:
      continue
    if not isinstance(value, str) or not value.strip():
      _fail(f'dataset.{key}', value, 'must be a pp string such as '
            '"decode|resize(224)|value_range(-1, 1)" or None')
    if dataset['augment'] is not None:
      raise ConfigError(f"config.dataset.{key}={value!r} and config.dataset.augment="
                        f"{dataset['augment']!r} are both set: augment is the older spelling "
                        'of the pp strings; set it to None')
    try:
      pp_lib.build(value, training=training)
    except ValueError as e:
      _fail(f'dataset.{key}', value, str(e))


def _validate_loss_and_mixup(config) -> None:
  _choice(config, 'loss.name', LOSSES)
  _number(config, 'mixup.p', low=0)
  _choice(config, 'mixup.granularity', MIXUP_GRANULARITIES)
  _int(config, 'mixup.size', 2)
  if config['loss']['name'] != 'softmax_xent' and config['label_smoothing']:
    raise ConfigError(f"config.label_smoothing={config['label_smoothing']!r}: applies to "
                      f"config.loss.name='softmax_xent' only, not {config['loss']['name']!r} "
                      "(smooth the targets in the pp string: onehot(..., on=, off=))")


def _validate_profile(config) -> None:
  _int(config, 'profile.first_profile', 0, optional=True)
  _int(config, 'profile.num_profile_steps', 1)
  _number(config, 'profile.every_secs', low=0, low_open=True, optional=True)
  _choice(config, 'profile.all_processes', (True, False))


def _validate_eval_datasets(config) -> None:
  """Names, keys and values of `config.evaluate.datasets`; pp strings parsed (no TF)."""
  datasets = config['evaluate']['datasets']
  if not hasattr(datasets, 'items'):
    _fail('evaluate.datasets', datasets, 'must be a dict {name: {dataset, split, pp, '
          'label_key}}')
  for name, entry in datasets.items():
    where = f'evaluate.datasets.{name}'
    if not isinstance(name, str) or not _EVAL_NAME.fullmatch(name):
      raise ConfigError(f'config.evaluate.datasets: name {name!r} must be letters, digits, '
                        "'_', '.' or '-' (it names the metrics eval/NAME/...)")
    if not hasattr(entry, 'keys'):
      _fail(where, entry, f'must be a dict with the keys {list(EVAL_DATASET_KEYS)} '
            "('split' required)")
    check_keys(entry, EVAL_DATASET_KEYS, f'config.{where}')
    split = entry.get('split')
    if not isinstance(split, str) or not split:
      _fail(f'{where}.split', split, 'must be a TFDS split such as "test" (required)')
    for key in ('dataset', 'label_key'):
      value = entry.get(key, EVAL_DATASET_KEYS[key])
      if value is not None and (not isinstance(value, str) or not value):
        _fail(f'{where}.{key}', value, 'must be a name' + (' or None (config.dataset.name)'
                                                           if key == 'dataset' else ''))
    value = entry.get('pp')
    if value is None:
      continue
    if not isinstance(value, str) or not value.strip():
      _fail(f'{where}.pp', value, 'must be a pp string or None (config.dataset.pp_eval)')
    try:
      pp_lib.build(value, training=False)
    except ValueError as e:
      _fail(f'{where}.pp', value, str(e))


def _validate_initialization(config) -> None:
  init = config['initialization']
  path = init['path']
  if path is not None and (not isinstance(path, str) or not path):
    _fail('initialization.path', path, 'must be a path (workdir, .npz or checkpoint prefix) '
          'or None')
  _int(config, 'initialization.step', 0, optional=True)
  for key in ('raise_if_target_unmatched', 'raise_if_source_unmatched'):
    _choice(config, f'initialization.{key}', (True, False))
  try:
    initialization.parse_rules(init['rules'])
  except ValueError as e:
    raise ConfigError(f'config.{e}') from None


def _weight_decay(value: Any) -> None:
  """A number >= 0, or a list of (regex, number >= 0) pairs."""
  if _is_number(value):
    if value < 0:
      _fail('optimizer.weight_decay', value, 'must be >= 0')
    return
  allowed = 'must be a number >= 0 or a list of (regex, value >= 0) pairs'
  if not isinstance(value, (list, tuple)):
    _fail('optimizer.weight_decay', value, allowed)
  for pair in value:
    if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and isinstance(pair[0], str)
            and _is_number(pair[1]) and pair[1] >= 0):
      _fail('optimizer.weight_decay', value, f'{allowed}; got the entry {pair!r}')
    try:
      re.compile(pair[0])
    except re.error as e:
      _fail('optimizer.weight_decay', value, f'{pair[0]!r} is not a regular expression ({e})')


def validate(config: Mapping[str, Any]) -> None:
  """Raises ConfigError (one line, naming the full key) for the first bad value."""
  reference = base_config()
  for section in _SECTIONS:
    node, ref = (config, reference) if not section else (_get(config, section),
                                                         _get(reference, section))
    if not hasattr(node, 'keys'):
      raise ConfigError(f'config.{section}={node!r}: must be a section (a dict of keys)')
    check_keys(node, ref.keys(), f'config.{section}' if section else 'config')
  # Data.
  name = config['dataset']['name']
  if not isinstance(name, str) or not name:
    _fail('dataset.name', name, 'must be a dataset name (an embedded or TFDS dataset)')
  for key in ('train_split', 'eval_split'):
    if not isinstance(config['dataset'][key], str) or not config['dataset'][key]:
      _fail(f'dataset.{key}', config['dataset'][key], 'must be a TFDS split such as "train"')
  _int(config, 'dataset.image_size', 1)
  _choice(config, 'dataset.channels', (1, 3))
  _int(config, 'dataset.shuffle_buffer', 1)
  _choice(config, 'dataset.sampling', SAMPLINGS)
  _choice(config, 'dataset.augment', AUGMENTATIONS, optional=True)
  _validate_pp(config)
  _validate_model(config)
  # Steps and batches.
  for key in ('batch_size', 'eval_batch_size', 'train_steps', 'log_every_steps'):
    _int(config, key, 1)
  _int(config, 'eval_every_steps', 0)
  _number(config, 'peak_flops_per_device', low=0, low_open=True, optional=True)
  _int(config, 'microsteps', 1)
  if config['batch_size'] % config['microsteps']:
    _fail('microsteps', config['microsteps'],
          f"must divide config.batch_size={config['batch_size']}")
  _int(config, 'seed')
  _int(config, 'checkpoint.every_steps', 1)
  _int(config, 'checkpoint.keep', 1)
  _int(config, 'checkpoint.keep_steps_multiple_of', 0)
  _choice(config, 'checkpoint.async_save', (True, False))
  # Optimizer and schedule.
  _choice(config, 'optimizer.name', OPTIMIZERS)
  for key in ('b1', 'b2', 'momentum'):
    _number(config, f'optimizer.{key}', low=0, high=1, high_open=True)
  _number(config, 'optimizer.eps', low=0, low_open=True)
  _choice(config, 'optimizer.mu_dtype', ('bfloat16', 'float32'), optional=True)
  _weight_decay(config['optimizer']['weight_decay'])
  _choice(config, 'optimizer.param_naming', PARAM_NAMINGS)
  _number(config, 'optimizer.gradient_clip_norm', low=0, low_open=True, optional=True)
  regex = config['optimizer']['weight_decay_regex']
  try:
    re.compile(regex)
  except (re.error, TypeError) as e:
    _fail('optimizer.weight_decay_regex', regex, f'must be a regular expression ({e})')
  regex = config['optimizer']['freeze']
  if regex is not None:
    try:
      re.compile(regex)
    except (re.error, TypeError) as e:
      _fail('optimizer.freeze', regex, f'must be a regular expression or None ({e})')
  _number(config, 'label_smoothing', low=0, high=1, high_open=True)
  _validate_loss_and_mixup(config)
  _validate_profile(config)
  _validate_eval_datasets(config)
  _validate_initialization(config)
  _choice(config, 'schedule.name', SCHEDULES)
  _number(config, 'schedule.peak_value', low=0, low_open=True)
  _number(config, 'schedule.end_value', low=0)
  _int(config, 'schedule.warmup_steps', 0)
  _int(config, 'schedule.decay_steps', 1, optional=True)
  _number(config, 'schedule.power', low=0, low_open=True)
  _int(config, 'schedule.transition_steps', 1)
  _number(config, 'schedule.decay_rate', low=0, low_open=True)
  _int(config, 'schedule.transition_begin', 0)
  if not isinstance(_get(config, 'schedule.staircase'), bool):
    _fail('schedule.staircase', _get(config, 'schedule.staircase'), 'must be True or False')
  _number(config, 'schedule.timescale', low=0, low_open=True)
  _int(config, 'schedule.cooldown_steps', 0)
  schedule = config['schedule']
  if schedule['name'] == 'big_vision_rsqrt':
    decay = schedule['decay_steps'] or max(
        int(config['train_steps']) - int(schedule['warmup_steps']), 1)
    if schedule['cooldown_steps'] > decay:
      _fail('schedule.cooldown_steps', schedule['cooldown_steps'],
            f'must be <= the decay steps ({decay}: schedule.decay_steps, else train_steps - '
            'warmup_steps)')
  # Mesh.
  for key in ('data', 'expert'):
    value = config['mesh'][key]
    if not is_int(value) or (value < 1 and value != -1):
      _fail(f'mesh.{key}', value, 'must be a positive integer or -1 (as many as fit)')
  if config['model']['name'] == 'vit_moe' and config['mesh']['expert'] > 0:
    num_experts = config['model']['encoder']['moe']['num_experts']
    if num_experts % config['mesh']['expert']:
      raise ConfigError(f"config.mesh.expert={config['mesh']['expert']} must divide "
                        f'config.model.encoder.moe.num_experts={num_experts}')
  # Few-shot (evaluate's own checks; ValueError there, as evaluate stands below train).
  try:
    fewshot_config.validate(config['fewshot'])
  except ValueError as e:
    raise ConfigError(str(e)) from None


def validate_for_devices(config: Mapping[str, Any], num_devices: int,
                         num_processes: int = 1) -> None:
  """The checks that depend on the machine: batches and mesh against the devices."""
  batch_keys = ['batch_size', 'eval_batch_size']
  if config['fewshot']['every_steps'] > 0:
    batch_keys.append('fewshot.batch_size')
  for key in batch_keys:
    value = _get(config, key)
    if value % num_devices or value % num_processes:
      _fail(key, value, f'must be a multiple of the number of devices ({num_devices}) and '
            f'of processes ({num_processes})')
  microbatch = config['batch_size'] // config['microsteps']
  if microbatch % num_devices or microbatch % num_processes:
    _fail('microsteps', config['microsteps'],
          f"leaves microbatches of {microbatch} examples (config.batch_size / microsteps), "
          f'not a multiple of the number of devices ({num_devices}) and of processes '
          f'({num_processes})')
  expert, data = config['mesh']['expert'], config['mesh']['data']
  if expert > 0 and num_devices % expert:
    _fail('mesh.expert', expert, f'must divide the number of devices ({num_devices}) or be -1')
  if data > 0 and expert > 0 and data * expert != num_devices:
    raise ConfigError(f'config.mesh.data x config.mesh.expert = {data} x {expert} must equal '
                      f'the number of devices ({num_devices}); use data=-1 for "the rest"')
