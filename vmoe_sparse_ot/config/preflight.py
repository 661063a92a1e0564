"""Pre-flight checks of a training config: what the config alone cannot decide.

Each reads the environment: the disk (`check_directory`; `make_directory`
creates a checked one), the datasets through
TensorFlow with their pp strings traced against the model's input
(`check_datasets`), the initialization source against the model's traced
parameter shapes (`check_initialization`). `check_before_training` runs them all
after `validation.validate` (the pure value checks) and `nn.build_model` (the
model's and routers' own options). Each failure is a one-line `ConfigError`
naming the key (or the OSError/ValueError kind the data check gives).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import jax
import numpy as np

from vmoe_sparse_ot import data
from vmoe_sparse_ot import initialization
from vmoe_sparse_ot import nn
from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot.nn import overrides as nn_overrides
from vmoe_sparse_ot.config import pp_targets
from vmoe_sparse_ot.errors import first_line
from vmoe_sparse_ot.nn.abstract_init import abstract_variables
from vmoe_sparse_ot.trees import flatten_tree
from vmoe_sparse_ot.config.schema import EVAL_DATASET_KEYS
from vmoe_sparse_ot.config.validation import ConfigError
from vmoe_sparse_ot.config.validation import validate


def check_initialization(config: Mapping[str, Any], workdir: str, model) -> None:
  """`config.initialization`'s source fits the model, for a run that starts afresh.

  Reads the source (kept for the trainer) and maps it onto the model's parameter
  shapes; a workdir that has checkpoints resumes instead and is not checked.
  """
  path = config['initialization']['path']
  if path is None or workdir_layout.has_checkpoint(workdir):
    return
  ds = config['dataset']
  abstract = abstract_variables(model, (ds['image_size'], ds['image_size'], ds['channels']))
  shapes = {k: v.shape for k, v in flatten_tree(abstract['params']).items()}
  try:
    initialization.plan(shapes, config['initialization'],
                        num_prefix_tokens=int(config['model']['classifier'] == 'token'))
  except ValueError as e:  # Messages name 'initialization.<key>' or the parameters.
    message = str(e)
    prefix = 'config.' if message.startswith('initialization') else 'config.initialization: '
    raise ConfigError(prefix + message) from None


def check_directory(path: str, what: str) -> None:
  """Raises ConfigError when directory `path` cannot be created or written.

  `what` names the setting (e.g. '--workdir' or 'config.dataset.data_dir'). Catches
  a path under a regular file, or an existing file in its place, before any work.
  """
  path = os.path.abspath(os.path.expanduser(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise ConfigError(f'{what}={path!r}: exists and is not a directory')
  parent = path
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise ConfigError(f'{what}={path!r}: {parent!r} is a file, not a directory')
  if not os.access(parent, os.W_OK | os.X_OK):
    raise ConfigError(f'{what}={path!r}: {parent!r} is not writable')


def make_directory(path: str, what: str) -> None:
  """Creates directory `path` and its parents; ConfigError naming `what` if it cannot.

  `check_directory` first; some refusals show only when trying (a path under
  /proc, which root may write by its permissions; a name too long).
  """
  check_directory(path, what)
  full = os.path.abspath(os.path.expanduser(path))
  try:
    os.makedirs(full, exist_ok=True)
  except OSError as e:
    raise ConfigError(f'{what}={full!r}: cannot create it ({e.strerror}: {e.filename!r})'
                      ) from None


def check_datasets(config: Mapping[str, Any], *, training: bool = True,
                   fewshot: bool | None = None) -> None:
  """Checks that the config's datasets exist with their splits; cheap, before any model.

  `training`: the training and evaluation dataset (`config.dataset`) and every
  `config.evaluate.datasets` entry, that their pp strings give the model's input
  and the targets the loss and mixup read (traced, no data read: see
  `config.pp_targets`) and that their labels fit `config.model.num_classes`.
  `fewshot`: every `config.fewshot.datasets` entry (default: when periodic
  few-shot is on). Raises FileNotFoundError (not
  prepared: names the dataset, the data_dir and how to prepare it) or ValueError
  (unknown name or split, too few classes), each one line.
  """
  ds = config['dataset']
  data_dir = ds['data_dir']
  if training:
    try:
      num_classes = data.check_dataset(ds['name'], [ds['train_split'], ds['eval_split']],
                                       data_dir)
    except (OSError, ValueError) as e:
      raise _same_kind(e, f'config.dataset: {first_line(e)}') from None
    for key, is_training in (('pp_train', True), ('pp_eval', False)):
      _check_pp_output(config, f'dataset.{key}', ds[key], training=is_training,
                       stored_shape=data.image_shape(ds['name'], data_dir))
    model_classes = config['model']['num_classes']
    if num_classes > model_classes:
      raise ConfigError(
          f'config.model.num_classes={model_classes}: must be >= {num_classes}, the '
          f"number of classes of config.dataset.name={ds['name']!r} (labels 0..{num_classes - 1})")
    _check_eval_datasets(config)
  if fewshot is None:
    fewshot = config['fewshot']['every_steps'] > 0
  if fewshot:
    for key, spec in config['fewshot']['datasets'].items():
      try:
        data.check_dataset(spec['name'], [spec['train_split'], spec['test_split']], data_dir)
      except (OSError, ValueError) as e:
        raise _same_kind(e, f'config.fewshot.datasets.{key}: {first_line(e)}') from None
      _check_fewshot_pp(config, key, data.image_shape(spec['name'], data_dir))


def _check_fewshot_pp(config, key: str, stored_shape: tuple | None) -> None:
  """config.fewshot.pp gives the model's input and the integer label on dataset `key`."""
  pp, ds = config['fewshot']['pp'], config['dataset']
  if pp is None:
    return
  try:
    specs = data.trace_pp(pp, training=False, image_size=ds['image_size'],
                          channels=ds['channels'], stored_shape=stored_shape)
  except ValueError as e:
    raise ConfigError(f'config.fewshot.pp (on config.fewshot.datasets.{key}): '
                      f'{first_line(e)}') from None
  label = specs.get('label')
  if label is None or label.shape.rank != 0 or not label.dtype.is_integer:
    raise ConfigError(f"config.fewshot.pp={pp!r}: must keep the integer 'label' "
                      "(few-shot fits on it), e.g. end with keep(\"image\", \"label\")")


def _check_pp_output(config, pp_key: str, pp: str | None, *, training: bool,
                     label_shape: tuple = (), stored_shape: tuple | None = None,
                     label_key: str = 'label') -> None:
  """The pp output is the model's input with targets the loss (and mixup) can read.

  `stored_shape`: (H, W, C) of the dataset's stored images, which the pp output
  must bring to the model's size (see `data.trace_pp`).
  """
  ds = config['dataset']
  size = ds['image_size']
  if pp is None:  # The `augment` modes give the image and keep the label.
    entries = {'image': ((size, size, ds['channels']), 'float32'),
               'label': (label_shape, 'int32')}
  else:
    try:
      specs = data.trace_pp(pp, training=training, image_size=size, channels=ds['channels'],
                            label_shape=label_shape, stored_shape=stored_shape,
                            label_key=label_key)
    except ValueError as e:
      raise ConfigError(f'config.{pp_key}: {first_line(e)}') from None
    entries = {k: (tuple(v.shape.as_list()) if v.shape.rank is not None else (None,),
                   v.dtype.name) for k, v in specs.items()}
  message = pp_targets.problem(
      entries, pp_key=pp_key, pp=pp, num_classes=config['model']['num_classes'],
      loss=config['loss']['name'], mixup_p=config['mixup']['p'], training=training)
  if message:
    raise ConfigError(message)


def _check_eval_datasets(config) -> None:
  """Each `config.evaluate.datasets` entry: its data, label feature and pp output."""
  ds = config['dataset']
  for name, entry in config['evaluate']['datasets'].items():
    entry = {**EVAL_DATASET_KEYS, **dict(entry)}
    dataset = entry['dataset'] or ds['name']
    where = f'config.evaluate.datasets.{name}'
    try:
      classes = data.check_dataset(dataset, [entry['split']], ds['data_dir'],
                                   label_key=entry['label_key'])
      label_shape = data.label_shape(dataset, entry['label_key'], ds['data_dir'])
    except (OSError, ValueError) as e:
      raise _same_kind(e, f'{where}: {first_line(e)}') from None
    if classes > config['model']['num_classes']:
      raise ConfigError(f"{where}: {entry['label_key']!r} of dataset {dataset!r} has "
                        f'{classes} classes; config.model.num_classes='
                        f"{config['model']['num_classes']} is too few")
    pp_key = (f'evaluate.datasets.{name}.pp' if entry['pp'] is not None
              else 'dataset.pp_eval')
    pp = entry['pp'] if entry['pp'] is not None else ds['pp_eval']
    _check_pp_output(config, pp_key, pp, training=False, label_shape=label_shape,
                     stored_shape=data.image_shape(dataset, ds['data_dir']),
                     label_key=entry['label_key'])


def _same_kind(e: BaseException, message: str) -> Exception:
  return FileNotFoundError(message) if isinstance(e, OSError) else ValueError(message)


def check_model_overrides(config: Mapping[str, Any]) -> None:
  """config.evaluate.model_overrides: model keys over config.model that keep its
  parameters (`nn.overrides`, which traces shapes); ConfigError naming the key otherwise."""
  overrides = config['evaluate'].get('model_overrides') or {}
  if not overrides:
    return
  ds = config['dataset']
  try:
    nn_overrides.same_variables_model_config(
        config['model'], overrides, (ds['image_size'], ds['image_size'], ds['channels']),
        'config.evaluate.model_overrides')
  except ValueError as e:
    raise ConfigError(str(e)) from None


def check_before_training(config: Mapping[str, Any], workdir: str) -> None:
  """All the training job's checks that need no model, then the model's own options.

  In order: `validate` (keys, types, ranges), --workdir and data_dir on disk,
  `check_datasets` (the training and evaluation data, and the few-shot data when
  periodic few-shot is on), `nn.build_model`, which checks the router's options
  and only creates a module object (no parameters), and, for a fresh run with
  `config.initialization.path`, that the source fits the model. Raises ValueError
  or OSError with a one-line message.
  """
  validate(config)
  check_directory(workdir, '--workdir')
  if config['dataset']['data_dir']:
    check_directory(config['dataset']['data_dir'], 'config.dataset.data_dir')
  check_datasets(config)
  model = nn.build_model(config['model'])
  check_model_overrides(config)
  check_initialization(config, workdir, model)
