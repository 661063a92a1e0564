"""The run record: what every checkpoint records about the run that wrote it.

A checkpoint's metadata is this record plus the step it was saved at. It holds
what fixes the meaning of the saved arrays and of "global batch t":

  model_config   the model (`nn.model_config`), less the keys that change how it
                 computes, not its parameters (`COMPUTE_KEYS`), and less keys added
                 later while they hold their defaults (`LATER_DEFAULTS`);
  param_shapes   {'a/b/kernel': shape} of the parameters;
  data           the training stream: dataset, split, global batch size, seed and
                 how it is read;
  optimizer      `config.optimizer`, less keys added later while at their defaults;
  schedule       the keys of `config.schedule` its schedule reads;
  train_steps    the run's length (the schedule may decay until it).

Rules for older checkpoints live here with the record they concern: a key added
after checkpoints existed is left out of the record while it holds its default,
so a record written before the key existed compares equal to today's.
"""
from __future__ import annotations

import json
from typing import Any

import ml_collections

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.nn import model_config as model_config_lib

# Optimizer keys added after checkpoints existed, and the default at which a
# record leaves each out.
_OPTIMIZER_LATER_DEFAULTS = {'freeze': None, 'mu_dtype': None, 'param_naming': 'ours'}


def as_json(tree: Any) -> Any:
  """`tree` after a JSON round trip: tuples become lists, as a checkpoint returns them."""
  return json.loads(json.dumps(tree))


def stream(dataset: Any, batch_size: int, seed: int) -> dict[str, Any]:
  """The record's 'data': what fixes the meaning of global batch t of the training stream.

  `dataset` is `config.dataset`. Checkpoints from before `sampling` existed read
  a 'stream' and recorded its shuffle_buffer: a 'stream' run records exactly that,
  so they still resume.
  """
  meta = {'name': dataset.name, 'split': dataset.train_split, 'batch_size': batch_size,
          'seed': seed}
  if dataset.sampling == 'stream':
    return meta | {'shuffle_buffer': int(dataset.shuffle_buffer)}
  return meta | {'sampling': dataset.sampling}


def optimizer(optimizer_config: Any) -> dict[str, Any]:
  """The record's 'optimizer': `config.optimizer` less later keys at their defaults."""
  return {k: v for k, v in as_json(optimizer_config.to_dict()).items()
          if not (k in _OPTIMIZER_LATER_DEFAULTS and v == _OPTIMIZER_LATER_DEFAULTS[k])}


def make(config: ml_collections.ConfigDict, abstract_params: Any) -> dict[str, Any]:
  """The run record of `config` (the step is added at each save).

  abstract_params: the model's parameters, arrays or ShapeDtypeStructs.
  """
  return {
      'model_config': model_config_lib.without_compute_keys(
          as_json(config.model.to_dict()), only_defaults=True),
      'param_shapes': checkpoints.param_shapes(abstract_params),
      'data': stream(config.dataset, int(config.batch_size), int(config.seed)),
      'optimizer': optimizer(config.optimizer),
      'schedule': as_json(config_lib.schedule_record(config.schedule.to_dict())),
      'train_steps': int(config.train_steps),
  }
