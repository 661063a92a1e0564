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

Here too are the comparisons of a record with a config: `check_compatible` and
`check_resume` (may a run resume from it?) and `model_config_differences` /
`resolve_model_config` (may a job evaluate it with this config's model?). Each
names every difference in one line.
"""
from __future__ import annotations

import copy
import json
from typing import Any

import ml_collections

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.errors import CheckpointMismatchError, ResumeMismatchError
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.model_config import COMPUTE_KEYS
from vmoe_sparse_ot.trees import differences, flatten, shape_differences

# What a record without them means: their values before they existed (history,
# like LATER_DEFAULTS below, so not read from today's option defaults).
COMPUTE_DEFAULTS = {'dtype': None, 'remat': False}


# Keys added after checkpoints recorded model configs, with their defaults: a
# record leaves them out at these values, and a record without them means these
# values, so workdirs written before they existed still resume and evaluate.
# (What those records mean, so written here, not read from today's defaults.)
LATER_DEFAULTS = {
    ('encoder', 'moe', 'dropout_rate'): None,
    ('encoder', 'moe', 'mlp_dim'): None,
    ('encoder', 'moe', 'router', 'capacity_ceil_or_round'): 'ceil',
    ('encoder', 'moe', 'router', 'capacity_multiple_of'): 4,
    ('encoder', 'attention_qk_norm'): False,
    ('encoder', 'position_emb'): 'learned',
    ('head_kernel_zero_init',): True,
    ('encoder', 'moe', 'router', 'soft_moe', 'num_slots'): None,
    ('encoder', 'moe', 'router', 'soft_moe', 'compute_similarity_metrics'): False,
    ('ensemble_size',): 1,
    ('encoder', 'moe', 'router', 'sparse_ot', 'tol'): 1e-6,
    ('encoder', 'moe', 'router', 'z_loss_weight'): 0.0,
    ('encoder', 'moe', 'router', 'gshard_loss_weight'): 0.0,
    ('encoder', 'moe', 'router', 'sparse_ot', 'combine_weights'): 'softmax',
    ('encoder', 'moe', 'router', 'sparse_ot', 'dispatch_zeros'): False,
    ('encoder', 'moe', 'router', 'l2_ot'): {
        'num_steps': 20, 'learning_rate': 1e-2, 'gamma': 1.0, 'combine_weights': 'softmax',
        'dispatch_zeros': False, 'implicit_differentiation': True},
    ('encoder', 'moe', 'router', 'kl_ot'): {
        'form': 'token_choice', 'solver': 'sinkhorn', 'num_iters': 20, 'epsilon': 1.0,
        'combine_weights': 'softmax', 'implicit_differentiation': True,
        'importance_loss_weight': 0.0, 'load_loss_weight': 0.0},
    ('encoder', 'moe', 'num_shared_experts'): 0,
}


# Router keys that choose how the router computes, not the model's parameters or
# its function: sparse_ot's implementation (the same plans up to rounding, see
# nn/routers/sparse_ot.py). Like COMPUTE_KEYS they are not compared when a
# checkpoint resumes or is evaluated: records from before 'auto' became the
# default hold 'fast', and resume under 'auto' (set 'fast' to continue
# bit-identically). Records keep them, so an evaluation with the checkpoint's
# config runs the path it trained with.
ROUTER_COMPUTE_KEYS = (('encoder', 'moe', 'router', 'sparse_ot', 'implementation'),)


def _without_router_compute_keys(model_config: dict) -> dict:
  for path in ROUTER_COMPUTE_KEYS:
    node = model_config
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(path[-1], None)
  return model_config


def _without_later_defaults(model_config: dict) -> dict:
  out = copy.deepcopy(model_config)
  for path, default in LATER_DEFAULTS.items():
    node = out
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and path[-1] in node and node[path[-1]] == default:
      del node[path[-1]]
  return out


def _with_resolved_solver_steps(model_config: dict) -> dict:
  """sparse_ot's num_steps=None as the count it means for its solver (10 for
  'newton', 50 for 'adam' and 'lbfgs'), so that a record from before None meant
  "the solver's default" (it held 50 with 'adam') compares equal to it."""
  node = model_config
  for key in ('encoder', 'moe', 'router', 'sparse_ot'):
    node = node.get(key) if isinstance(node, dict) else None
  if isinstance(node, dict) and node.get('num_steps', 0) is None:
    solver = node.get('solver', routers.sparse_ot.SparseOTOptions.solver)
    node['num_steps'] = routers.sparse_ot.num_steps(
        routers.sparse_ot.SparseOTOptions(solver=solver))
  return model_config


def without_compute_keys(model_config, *, only_defaults: bool = False) -> dict:
  """A copy of a model config dict without `COMPUTE_KEYS` (with `only_defaults`,
  only those at their defaults, so a record looks as it did before they existed),
  without the `LATER_DEFAULTS` keys at their defaults, and (without
  `only_defaults`: for comparisons) without `ROUTER_COMPUTE_KEYS`."""
  out = _without_later_defaults(
      {k: v for k, v in dict(model_config).items()
       if k not in COMPUTE_KEYS or (only_defaults and v != COMPUTE_DEFAULTS[k])})
  return out if only_defaults else _without_router_compute_keys(
      _with_resolved_solver_steps(out))


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
      'model_config': without_compute_keys(
          as_json(config.model.to_dict()), only_defaults=True),
      'param_shapes': checkpoints.param_shapes(abstract_params),
      'data': stream(config.dataset, int(config.batch_size), int(config.seed)),
      'optimizer': optimizer(config.optimizer),
      'schedule': as_json(config_lib.schedule_record(config.schedule.to_dict())),
      'train_steps': int(config.train_steps),
  }


def _differences(saved: Any, now: Any, prefix: str) -> list[str]:
  """'prefix.a.b: checkpoint X, config Y' per differing key (`prefix` alone for a value)."""
  named = lambda tree: flatten(tree, prefix + '.') if isinstance(tree, dict) else {prefix: tree}
  return differences(named(saved), named(now), labels=('checkpoint', 'config'), show=repr)


def _join(problems: list[str], limit: int = 12) -> str:
  more = f'; ... and {len(problems) - limit} more' if len(problems) > limit else ''
  return '; '.join(problems[:limit]) + more


def check_compatible(meta: dict[str, Any], model_config: dict[str, Any],
                     abstract_params: Any, directory: str) -> None:
  """Raises ResumeMismatchError naming what differs between a checkpoint and the model."""
  # model.dtype / model.remat change how the model computes, not its parameters.
  problems = _differences(without_compute_keys(meta.get('model_config') or {}),
                          without_compute_keys(model_config), 'model')
  problems += ['param ' + line for line in shape_differences(
      meta.get('param_shapes', {}), checkpoints.param_shapes(abstract_params),
      labels=('checkpoint shape', 'config shape'))]
  if problems:
    raise ResumeMismatchError(
        f'The checkpoint in {directory} does not match the config; use a fresh --workdir '
        f'or the config it was trained with. Differences: {_join(problems)}')


_SAMPLING_HINT = ("(A checkpoint without dataset.sampling read its data with "
                  "config.dataset.sampling='stream': set it to resume.) ")


def check_resume(meta: dict[str, Any], expected: dict[str, Any], directory: str, *,
                 allow_schedule_change: bool = False) -> list[str]:
  """Compares the input stream, optimizer and schedule of a checkpoint with this run.

  `expected` holds this run's 'data', 'optimizer', 'schedule' and 'train_steps'.
  A different input stream or optimizer always fails (the optimizer state would
  not fit or would mean something else); a different schedule or train_steps
  fails unless `allow_schedule_change`, and is then returned, to be logged.
  A key the checkpoint does not record is not compared.
  """
  step = meta.get('step', '?')
  if 'data' in meta and meta['data'] != expected['data']:
    raise ResumeMismatchError(
        f'The checkpoint in {directory} was trained on a different input stream: '
        f'{_join(_differences(meta["data"], expected["data"], "dataset"))}. '
        f'{_SAMPLING_HINT if "sampling" not in meta["data"] else ""}Use a fresh --workdir.')
  if 'optimizer' in meta:
    changed = _differences(meta['optimizer'], expected['optimizer'], 'optimizer')
    if changed:
      raise ResumeMismatchError(
          f'Cannot resume from step {step} in {directory}: the optimizer differs from the '
          f'checkpoint\'s: {_join(changed)}. Use the checkpoint\'s optimizer settings or a '
          'fresh --workdir.')
  changed = []
  if 'schedule' in meta:
    changed += _differences(meta['schedule'], expected['schedule'], 'schedule')
  if 'train_steps' in meta:
    changed += _differences(meta['train_steps'], expected['train_steps'], 'train_steps')
  if changed and not allow_schedule_change:
    raise ResumeMismatchError(
        f'Resuming from step {step} in {directory} would change the learning-rate schedule: '
        f'{_join(changed)}. Pass allow_schedule_change (main: --allow_schedule_change) to '
        'continue with the new one, or use the checkpoint\'s values.')
  return changed


def model_config_differences(saved: dict[str, Any], model_config: Any) -> list[str]:
  """'model.a.b: config X, checkpoint Y' for every key where the two model configs differ.

  `nn.model_config.COMPUTE_KEYS` (model.dtype, model.remat) are not compared: they
  change how the model computes, not its parameters.
  """
  # JSON round trip: tuples become lists, as they come back from the checkpoint.
  now = as_json(model_config.to_dict() if hasattr(model_config, 'to_dict')
                else dict(model_config))
  return differences(flatten(without_compute_keys(now), 'model.'),
                     flatten(without_compute_keys(saved), 'model.'),
                     labels=('config', 'checkpoint'), show=repr)


def resolve_model_config(config: ml_collections.ConfigDict, meta: dict[str, Any], *,
                         use_checkpoint_config: bool, where: str) -> ml_collections.ConfigDict:
  """`config`, or a copy whose `model` is the checkpoint's `meta['model_config']`.

  Raises CheckpointMismatchError (one line naming every differing key with both
  values) when `config.model` disagrees and `use_checkpoint_config` is False.
  `where` names the checkpoint in the message.
  """
  saved = meta.get('model_config')
  if saved is None:  # Old checkpoints: only the parameter shapes can be compared.
    return config
  diffs = model_config_differences(saved, config.model)
  if not diffs:
    return config
  if not use_checkpoint_config:
    raise CheckpointMismatchError(
        f'config.model differs from the model config of {where}: ' + '; '.join(diffs[:20])
        + (f'; ... and {len(diffs) - 20} more' if len(diffs) > 20 else '')
        + ". Pass --use_checkpoint_config to evaluate with the checkpoint's model config.")
  resolved = ml_collections.ConfigDict(config.to_dict())
  resolved.model = ml_collections.ConfigDict(saved)
  return resolved
