r"""Standalone evaluation of a checkpoint, optionally with other routing than it was trained with.

    python -m vmoe_sparse_ot.evaluate --workdir=W [--step=N]
        [--dataset=NAME] [--split=SPLIT] [--data_dir=DIR] [--batch_size=B] [--name=NAME]
        [--router=NAME] [--num_selected_experts=K] [--capacity_factor=F | --capacity=C]
        [--batch_priority | --nobatch_priority]
        [--config=path.py[:arg] [--config.dataset.KEY=VALUE ...]]
    python -m vmoe_sparse_ot.evaluate --checkpoint=PREFIX_OR_NPZ --config=path.py[:arg]
        [the same data and routing flags]

Restores checkpoint N of W/checkpoints (default: the latest), builds the model from
the checkpoint's metadata (the model config it was trained with: no --config is
needed), applies the routing flags to `model.encoder.moe.router`, evaluates every
example of a dataset split once, prints loss, top-1 accuracy and routing statistics
per MoE layer, and writes W/eval/NAME.json (atomically: a temporary file renamed
into place).

Routing is changed with flags only (`evaluate.overrides`, shared with
`vmoe_sparse_ot.load`); a flag left out keeps the checkpoint's value:
  --router=sparse_ot        another router (any sparse router runs on any sparse
                            checkpoint: their router layer is the same Dense(E))
  --num_selected_experts=K  experts per token
  --capacity_factor=F       C = ceil(S * K * F / E) rounded up to a multiple of 4
                            (expert_choice: ceil(S * F / E), without K)
  --capacity=C              C as is (capped at S); give this or --capacity_factor
  --[no]batch_priority      token-choice routers: the tokens with the largest top
                            gate claim buffer slots first
--config names the data side only (dataset, eval_batch_size); its `model` must be
the checkpoint's (a differing key is refused with both values, as few-shot does).

--checkpoint evaluates weights that have no workdir of this project (a released
checkpoint: the reference V-MoE code's partitioned prefix PREFIX.index +
PREFIX.data-*, or a .npz), read by `evaluate.released.read_weights`: the model
comes from --config (required; its `model`, and the data settings as above), the
weights from the checkpoint, which must be exactly that model's (names mapped by
`initialization.names`; a missing, extra or reshaped parameter is refused). The
report is the same; the results go to stdout as one JSON line after it, and
nothing is written anywhere. Checkpoint, config and data_dir may be remote paths
(`gs://...`, read through `vmoe_sparse_ot.filesystem`).

Where the other settings come from, first match wins: the flags; --config; the
run's W/config.json (written by the trainer); the checkpoint (dataset name). So
by default it is the run's evaluation set: `dataset.name`, `dataset.eval_split`,
`dataset.data_dir`, `dataset.pp_eval` or `dataset.augment` (kept only for the
run's dataset) and
`eval_batch_size`. The image size and channels are the model's, read from its
parameter shapes (a model without a position-embedding parameter, 'sincos2d' or
'none': --config's dataset.image_size). NAME defaults to DATASET-SPLIT plus tags
of the routing flags and the step when --step is given, e.g. `embedded_mnist-test-cf0.5-bpr` or
`embedded_mnist-test-sparse_ot-k1-step3` (characters other than letters, digits
and `._=+-` become `_`).

Routing statistics come from the `expert_weights` (G, S, E) each MoE layer sows
(`nn.routing_stats`), over the real examples only (eval batches are padded
with masked examples, and the last group of a batch with padding tokens; neither
counts): a token is dropped when its combine weight from every expert is 0; the
load of an expert is the fraction of tokens it took; experts per token is their
mean count (the sum of the loads). Counts are summed on device and fetched once.
Padding examples still take part in routing, as they do in training and in the
trainer's evaluation: tokens of one group compete for the same buffer slots.

Parameters are laid out on a mesh of all devices, expert parameters split over
'expert' (as many shards as divide both the devices and the experts), and each
batch is split over every device. One process.

Bad input (a missing workdir or checkpoint step, an unknown router or dataset, a
capacity factor <= 0, routing that does not fit the checkpoint, a batch size the
devices do not divide; both or neither of --workdir and --checkpoint, --checkpoint
without --config, a --checkpoint that is missing or does not fit the config's
model) is one line on stderr and exit status 2, found before anything compiles
(a workdir's arrays are not read by then; a --checkpoint's are, once); nothing is
written. A workdir checkpoint that fails to restore is exit status 1.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from typing import Any, Sequence

import jax
import ml_collections
from absl import flags
from jax.sharding import PartitionSpec
from ml_collections import config_flags

from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot import atomic
from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import data
from vmoe_sparse_ot import filesystem
from vmoe_sparse_ot import nn
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot import quiet_logs
from vmoe_sparse_ot.config import cli
from vmoe_sparse_ot.config import reference
from vmoe_sparse_ot.errors import CheckpointRestoreError
from vmoe_sparse_ot.errors import first_line
from vmoe_sparse_ot.evaluate import overrides as overrides_lib
from vmoe_sparse_ot.evaluate import released
from vmoe_sparse_ot.evaluate.checkpoint_config import describe_model
from vmoe_sparse_ot.evaluate.checkpoint_config import read_checkpoint_meta
from vmoe_sparse_ot.nn import routing_stats
from vmoe_sparse_ot.train import evaluation
from vmoe_sparse_ot.train.run_record import model_config_differences
from vmoe_sparse_ot.train import periodic_eval

PROG = 'python -m vmoe_sparse_ot.evaluate'
EVAL_DIR = workdir_layout.EVAL_DIR
DEFAULT_BATCH_SIZE = 256
_NAME_OK = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._=+-]*$')


class UsageError(ValueError):
  """A bad flag or setting; the message is one line naming it."""


@dataclasses.dataclass(frozen=True)
class Request:
  """A checked evaluation: what `run` evaluates and where it writes.

  Either `workdir` and `step` (a workdir of this project), or `checkpoint` and its
  `weights` (`released.Weights`, read by `prepare`; `workdir` and `step` None).
  """
  workdir: str | None
  step: int | None
  meta: dict[str, Any]
  model_config: dict[str, Any]      # the checkpoint's, with the routing overrides
  overrides: dict[str, Any]
  dataset: str
  split: str
  data_dir: str | None
  augment: str | None
  image_shape: tuple[int, int, int]
  batch_size: int                   # global
  name: str
  pp: str | None = None             # the run's pp_eval, for the run's dataset
  loss: str = 'softmax_xent'        # the run's config.loss.name
  checkpoint: str | None = None     # --checkpoint, as given (a local or remote path)
  weights: Any = None               # its released.Weights

  @property
  def path(self) -> str | None:
    """W/eval/NAME.json; None for a --checkpoint (nothing is written)."""
    if self.workdir is None:
      return None
    return os.path.join(self.workdir, EVAL_DIR, f'{self.name}.json')


def _run_config(workdir: str, config: ml_collections.ConfigDict | None) -> dict[str, Any]:
  """--config as a dict, else the trainer's W/config.json, else {}."""
  if config is not None:
    return config.to_dict()
  path = os.path.join(workdir, workdir_layout.CONFIG)
  if not os.path.isfile(path):
    return {}
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError) as e:
    raise UsageError(f'{path}: cannot read the run config ({e}); name the data with '
                     '--dataset/--split or --config') from None


def default_name(dataset: str, split: str, overrides: dict[str, Any],
                 step: int | None) -> str:
  """'embedded_mnist-test-cf0.5-bpr' (with '-stepN' when a step was asked for)."""
  def clean(part: str) -> str:
    return re.sub(r'[^A-Za-z0-9._=+-]+', '_', part).strip('_')

  name = f'{clean(dataset)}-{clean(split)}{overrides_lib.name_suffix(overrides)}'
  return name + (f'-step{step}' if step is not None else '')


def prepare(workdir: str | None = None, step: int | None = None, *,
            checkpoint: str | None = None, dataset: str | None = None,
            split: str | None = None, data_dir: str | None = None,
            batch_size: int | None = None, name: str | None = None,
            config: ml_collections.ConfigDict | None = None, num_devices: int | None = None,
            **overrides: Any) -> Request:
  """Every check before anything compiles, in the order a user would fix them.

  From a `workdir`, reads only the checkpoint's metadata and the dataset's. From
  a `checkpoint` (with `config`, whose model it must be), reads its arrays once
  (they travel in the Request). `overrides` are the routing overrides
  (`evaluate.overrides.ROUTING_OVERRIDES`); `num_devices` (default: all) must
  divide the batch size. Raises UsageError or `overrides.RoutingOverrideError`
  (both ValueErrors, one line naming the flag).
  """
  if (workdir is None) == (checkpoint is None):
    raise UsageError('--workdir, --checkpoint: give exactly one (a workdir of this project, '
                     'or a checkpoint with --config)')
  if checkpoint is not None:
    if config is None:
      raise UsageError(f'--checkpoint={checkpoint}: needs --config (the model comes from '
                       'the config file)')
    if step is not None:
      raise UsageError(f'--step={step}: applies to --workdir only (a --checkpoint is one step)')
  elif not workdir or not os.path.isdir(workdir):
    raise UsageError(f'--workdir={workdir!r}: not a directory')
  _check_flags(name, batch_size)
  overrides = overrides_lib.normalize_routing_overrides(overrides)
  if checkpoint is not None:
    return _prepare_checkpoint(checkpoint, config, overrides, dataset=dataset, split=split,
                               data_dir=data_dir, batch_size=batch_size, name=name,
                               num_devices=num_devices)
  return _prepare_workdir(workdir, step, overrides, dataset=dataset, split=split,
                          data_dir=data_dir, batch_size=batch_size, name=name, config=config,
                          num_devices=num_devices)


def _check_flags(name: str | None, batch_size: int | None) -> None:
  if name is not None and not _NAME_OK.match(name):
    raise UsageError(f"--name={name!r}: must be a file name of letters, digits and '._=+-', "
                     'not starting with a punctuation mark')
  if batch_size is not None and batch_size < 1:
    raise UsageError(f'--batch_size={batch_size}: must be >= 1')


def _prepare_workdir(workdir: str, step: int | None, overrides: dict[str, Any], *,
                     dataset, split, data_dir, batch_size, name, config,
                     num_devices) -> Request:
  try:
    meta, found = read_checkpoint_meta(workdir, step)
    # Where the results go: refused now rather than after the evaluation.
    config_lib.check_directory(os.path.join(workdir, EVAL_DIR), '--workdir')
  except ValueError as e:
    raise UsageError(str(e)) from None
  saved = meta.get('model_config')
  if saved is None or 'param_shapes' not in meta:
    raise UsageError(f'--workdir={workdir}: checkpoint step {found} records no model config '
                     '(written by an older version): cannot build its model')
  run_config = _run_config(workdir, config)
  if config is not None:
    diffs = model_config_differences(saved, config.model)
    if diffs:
      raise UsageError(
          "--config: config.model differs from the checkpoint's model config ("
          + '; '.join(diffs[:6]) + ('; ...' if len(diffs) > 6 else '') + '); the model comes '
          'from the checkpoint: change routing with --router, --num_selected_experts, '
          '--capacity_factor, --capacity, --batch_priority')

  model_config = overrides_lib.apply_routing_overrides(saved, **overrides)
  try:
    image_shape = overrides_lib.image_shape(meta['param_shapes'], model_config['classifier'])
  except (KeyError, ValueError) as e:
    raise UsageError(f'--workdir={workdir}: checkpoint step {found}: {e}') from None
  settings = _data_settings(run_config, model_config, meta.get('data', {}).get('name'),
                            dataset=dataset, split=split, data_dir=data_dir,
                            batch_size=batch_size, num_devices=num_devices,
                            where='--config' if config is not None else
                            "the run's config.json" if run_config else 'the default')
  # Last: it traces the model's init (shapes only).
  overrides_lib.check_param_shapes(nn.build_model(model_config), meta['param_shapes'],
                                   overrides, image_shape)
  return Request(
      workdir=os.path.abspath(workdir), step=int(found), meta=meta, model_config=model_config,
      overrides=overrides, image_shape=image_shape,
      name=name or default_name(settings['dataset'], settings['split'], overrides, step),
      **settings)


def _prepare_checkpoint(checkpoint: str, config: ml_collections.ConfigDict,
                        overrides: dict[str, Any], *, dataset, split, data_dir, batch_size,
                        name, num_devices) -> Request:
  try:
    config_lib.validate(config)
  except ValueError as e:
    raise UsageError(f'--config: {first_line(e)}') from None
  model_config = json.loads(json.dumps(config.model.to_dict()))
  evaluated = overrides_lib.apply_routing_overrides(model_config, **overrides)
  settings = _data_settings(config.to_dict(), evaluated, None, dataset=dataset, split=split,
                            data_dir=data_dir, batch_size=batch_size, num_devices=num_devices,
                            where='--config')
  try:  # After the cheap checks: this reads every array of the checkpoint.
    weights = released.read_weights(checkpoint, model_config,
                                    image_size=config.dataset.get('image_size'))
  except ValueError as e:
    raise UsageError(first_line(e)) from None
  # Routing overrides that change parameters (another router's layer) are refused here.
  overrides_lib.check_param_shapes(nn.build_model(evaluated), weights.param_shapes, overrides,
                                   weights.image_shape)
  meta = {'model_config': model_config, 'param_shapes': weights.param_shapes}
  return Request(
      workdir=None, step=None, meta=meta, model_config=evaluated, overrides=overrides,
      image_shape=weights.image_shape,
      name=name or default_name(settings['dataset'], settings['split'], overrides, None),
      checkpoint=checkpoint, weights=weights, **settings)


def _data_settings(run_config: dict[str, Any], model_config: dict[str, Any],
                   checkpoint_dataset: str | None, *, dataset, split, data_dir, batch_size,
                   num_devices, where: str) -> dict[str, Any]:
  """The Request's data fields: the flags, else the run's (or --config's) settings.

  `where` names the source of the config's batch size in its error message.
  """
  run_data = run_config.get('dataset', {})
  dataset = dataset or run_data.get('name') or checkpoint_dataset
  if not dataset:
    raise UsageError('--dataset: required (the workdir has no config.json and the checkpoint '
                     'names no dataset)')
  same = dataset == run_data.get('name')
  split = split or (run_data.get('eval_split') if same else None) or 'test'
  data_dir = data_dir or run_data.get('data_dir')
  if data_dir and not filesystem.is_remote(data_dir):  # TFDS reads gs:// data_dirs itself.
    config_lib.check_directory(data_dir, '--data_dir')
  try:
    data.check_dataset(dataset, [], data_dir)
  except (OSError, ValueError) as e:
    raise UsageError(f'--dataset={dataset}: {first_line(e)}') from None
  try:
    num_classes = data.check_dataset(dataset, [split], data_dir)
  except (OSError, ValueError) as e:
    raise UsageError(f'--split={split}: {first_line(e)}') from None
  if num_classes > int(model_config['num_classes']):
    raise UsageError(f'--dataset={dataset}: has {num_classes} classes, more than the model\'s '
                     f'{model_config["num_classes"]} outputs')

  num_devices = num_devices or jax.device_count()
  if batch_size is not None and batch_size % num_devices:
    raise UsageError(f'--batch_size={batch_size}: must be a multiple of the number of devices '
                     f'({num_devices})')
  if batch_size is None:
    batch_size = int(run_config.get('eval_batch_size') or DEFAULT_BATCH_SIZE)
    if batch_size % num_devices:
      raise UsageError(f'--batch_size: the batch size {batch_size} from {where} is not a '
                       f'multiple of the number of devices ({num_devices}); pass --batch_size')
  return dict(dataset=dataset, split=split, data_dir=data_dir,
              augment=run_data.get('augment') if same else None, batch_size=batch_size,
              pp=run_data.get('pp_eval') if same else None,
              loss=run_config.get('loss', {}).get('name') or 'softmax_xent')


def run(request: Request, *, devices: Sequence[Any] | None = None) -> dict[str, Any]:
  """Evaluates `request` on `devices` (default: all), writes its JSON, returns the payload.

  A --checkpoint request (`request.path` None) writes nothing. Raises
  CheckpointRestoreError (a FileNotFoundError) when a workdir's arrays do not restore.
  """
  model_config = request.model_config
  model = nn.build_model(model_config)
  moe = model_config['encoder']['moe'] if model_config['name'] == 'vit_moe' else None
  # All devices; the expert axis as long as divides both the devices and the experts.
  mesh = parallel.make_mesh({'data': -1, 'expert': -1}, devices,
                                int(moe['num_experts']) if moe else 1)
  if request.batch_size % (mesh.size * jax.process_count()):
    raise UsageError(f'--batch_size={request.batch_size}: must be a multiple of the number of '
                     f'devices ({mesh.size}) and processes ({jax.process_count()})')
  params, step, saved_state = _restore(request)
  params_sharding = parallel.param_shardings(
      mesh, params, [(nn.EXPERT_PARAMS_REGEX, PartitionSpec('expert'))])
  params = jax.device_put(params, params_sharding)
  # The router state the checkpoint routes with (topk_bias's bias), replicated.
  model_state = jax.device_put(
      nn.router_state.for_model(model, request.image_shape, saved_state),
      parallel.replicated(mesh))
  batch_sharding = parallel.batch_sharding(mesh)
  num_tokens = overrides_lib.num_tokens(request.meta['param_shapes'], request.image_shape,
                                        model_config['classifier'])
  eval_step = jax.jit(periodic_eval.make_eval_step(model, request.loss, num_tokens=num_tokens),
                      in_shardings=(params_sharding, batch_sharding,
                                    parallel.replicated(mesh)),
                      out_shardings=parallel.replicated(mesh))
  height, _, channels = request.image_shape
  dataset = data.make_dataset(
      request.dataset, request.split, batch_size=request.batch_size // jax.process_count(),
      image_size=height, channels=channels, training=False, data_dir=request.data_dir,
      augment=request.augment, pp=request.pp)
  with jax.set_mesh(mesh):
    totals = evaluation.totals(eval_step, params, dataset, batch_sharding, model_state)
  if totals is None:
    raise UsageError(f'--split={request.split}: the split holds no examples')
  metrics = evaluation.metrics(totals)
  count = metrics['num_examples']
  payload = {
      'workdir': request.workdir,
      'step': step,
      **({'checkpoint': request.checkpoint} if request.checkpoint is not None else {}),
      'name': request.name,
      'dataset': {'name': request.dataset, 'split': request.split, 'data_dir': request.data_dir,
                  'num_examples': count, 'batch_size': request.batch_size,
                  'image_shape': list(request.image_shape)},
      'model': {**describe_model(model_config),
                'trained_router': describe_model(request.meta['model_config'])['router']},
      'overrides': request.overrides,
      'routing_config': _routing_config(model_config),
      'model_config': model_config,
      'metrics': {'loss': metrics.pop('loss'), 'loss_name': request.loss,
                  'accuracy': metrics.pop('accuracy'), 'num_examples': metrics.pop('num_examples')},
      'routing': {layer: routing_stats.summarize(sums)
                  for layer, sums in totals['routing'].items()},
      'mesh': {k: int(v) for k, v in mesh.shape.items()},
  }
  ensemble = totals.get('ensemble')
  if ensemble is not None:  # E³: ECE, and each member's metrics and routing.
    payload['metrics'].update({k: v for k, v in metrics.items() if k != 'dropped_fraction'})
    payload['metrics']['ensemble_size'] = nn.ensemble_size(model)
    for layer, members in ensemble['routing'].items():
      for i, sums in enumerate(members):
        payload['routing'][f'{layer}/member{i}'] = routing_stats.summarize(sums)
  if request.weights is not None and request.weights.ignored:
    payload['checkpoint_entries_ignored'] = request.weights.ignored
  if jax.process_index() == 0 and request.path is not None:
    atomic.write_json(request.path, payload)
  return payload


def _restore(request: Request) -> tuple[Any, int | None, Any]:
  """(params tree, step or None, the saved router state or None) of `request`."""
  if request.weights is not None:   # A --checkpoint: a reference run has no router state.
    return request.weights.params, None, None
  params, _, step = checkpoints.restore_params_with_meta(request.workdir, request.step)
  return params, int(step), checkpoints.restore_model_state(request.workdir, step)


def _routing_config(model_config: dict[str, Any]) -> dict[str, Any] | None:
  """The routing the evaluation ran with: router, K, C and the keys that set C."""
  if model_config['name'] != 'vit_moe':
    return None
  moe = model_config['encoder']['moe']
  router = moe['router']
  out = {'router': router['name']}
  out.update({k: router.get(k) for k in overrides_lib.ROUTING_OVERRIDES if k != 'router'})
  out.update(num_experts=int(moe['num_experts']), group_size=int(moe['group_size']),
             buffer_capacity=overrides_lib.capacity(model_config))
  return out


def format_report(payload: dict[str, Any]) -> str:
  """What the job prints: the setting, loss and top-1, and one routing line per MoE layer."""
  ds, metrics, model = payload['dataset'], payload['metrics'], payload['model']
  source = (f"{payload['workdir']} at step {payload['step']}" if payload['workdir'] is not None
            else payload['checkpoint'])
  lines = [(f"Evaluated {source} on {ds['name']} "
           f"{ds['split']} ({ds['num_examples']} examples, batch {ds['batch_size']}, "
           f"mesh data={payload['mesh']['data']} x expert={payload['mesh']['expert']})")]
  routing = payload.get('routing_config')
  if routing:
    changed = overrides_lib.describe({k: v for k, v in payload['overrides'].items()
                                      if k != 'router'})  # The router is named already.
    lines.append(
        f"Model {model['name']} trained with router {model['trained_router']}; evaluated with "
        f"router {routing['router']}{f' ({changed})' if changed else ''}"
        f"{'' if payload['overrides'] else ' (as trained)'}: "
        f"K={routing['num_selected_experts']}, C={routing['buffer_capacity']} slots per "
        f"expert and group of S={routing['group_size']} tokens, E={routing['num_experts']}")
  else:
    lines.append(f"Model {model['name']} (no MoE layers)")
  lines.append(f"loss ({metrics.get('loss_name', 'softmax_xent')}) {metrics['loss']:.4f}, "
               f"top-1 accuracy {100 * metrics['accuracy']:.2f}%")
  if payload['routing']:
    rows = [('MoE layer', 'dropped', 'experts/token', 'load per expert (fraction of tokens)')]
    for layer, r in payload['routing'].items():
      rows.append((layer, f"{100 * r['dropped_fraction']:.2f}%", f"{r['experts_per_token']:.3f}",
                   ' '.join(f'{v:.3f}' for v in r['expert_load'])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ['  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
  return '\n'.join(lines)


def _define_flags(fv: flags.FlagValues) -> dict[str, Any]:
  holders = {
      'workdir': flags.DEFINE_string('workdir', None, 'Training workdir holding checkpoints/.',
                                     flag_values=fv),
      'checkpoint': flags.DEFINE_string(
          'checkpoint', None, 'Instead of --workdir: a checkpoint without a workdir (a '
          'partitioned PREFIX of the reference V-MoE code, or a .npz; may be gs://), with '
          '--config giving its model. Results go to stdout; nothing is written.',
          flag_values=fv),
      'step': flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).',
                                   flag_values=fv),
      'dataset': flags.DEFINE_string('dataset', None, "Dataset (default: the run's).",
                                     flag_values=fv),
      'split': flags.DEFINE_string('split', None, "Split, TFDS slicing allowed (default: the "
                                   "run's eval split, or 'test').", flag_values=fv),
      'data_dir': flags.DEFINE_string('data_dir', None, "TFDS data_dir (default: the run's).",
                                      flag_values=fv),
      'batch_size': flags.DEFINE_integer('batch_size', None, "Global batch size (default: the "
                                         f"run's eval_batch_size, or {DEFAULT_BATCH_SIZE}).",
                                         flag_values=fv),
      'name': flags.DEFINE_string('name', None, 'Results file W/eval/NAME.json (default: '
                                  'DATASET-SPLIT and tags of the routing flags).', flag_values=fv),
      'router': flags.DEFINE_string('router', None, 'Route with this router instead.',
                                    flag_values=fv),
      'num_selected_experts': flags.DEFINE_integer('num_selected_experts', None,
                                                   'K, experts per token.', flag_values=fv),
      'capacity_factor': flags.DEFINE_float('capacity_factor', None, 'Capacity factor F: '
                                            'C = ceil(S*K*F/E) rounded up to a multiple of 4 '
                                            '(expert_choice: ceil(S*F/E)).',
                                            flag_values=fv),
      'capacity': flags.DEFINE_integer('capacity', None, 'C, buffer slots per expert and group.',
                                       flag_values=fv),
      'batch_priority': flags.DEFINE_bool('batch_priority', None, 'Batch-prioritized routing '
                                          '(--nobatch_priority: in token order).', flag_values=fv),
      'config': config_flags.DEFINE_config_file(
          'config', None, 'Config file naming the data (dataset, eval_batch_size); with '
          "--workdir optional, its model must be the checkpoint's; with --checkpoint "
          'required, it gives the model.', flag_values=fv, lock_config=True),
  }
  fv['config'].parser = cli.ConfigFileParser('config')
  return holders


def _usage(fv: flags.FlagValues) -> str:
  # Title, usage, what it does, the routing flags, --checkpoint.
  doc = __doc__.strip().split('\n\n')
  return '\n\n'.join(doc[:5]) + '\n\nFlags:\n' + fv.get_help(include_special_flags=False)


def main(argv: Sequence[str] | None = None) -> None:
  """The command line; callable in-process (its flags are its own, not absl's global ones)."""
  argv = list(sys.argv if argv is None else argv)
  fv = flags.FlagValues()
  values = _define_flags(fv)
  if any(arg in ('-h', '--help', '--helpshort', '--helpfull', '-?') for arg in argv[1:]):
    print(_usage(fv))
    return
  rest = cli.parse_flags(PROG, argv, flag_values=fv)
  if len(rest) > 1:
    cli.fail(PROG, f'unexpected arguments {rest[1:]}')
  quiet_logs.quiet_library_logs()
  workdir, checkpoint = values['workdir'].value, values['checkpoint'].value
  if workdir and checkpoint:
    cli.fail(PROG, '--workdir and --checkpoint: give one of them (a workdir of this project, '
             'or a checkpoint with --config)')
  if not workdir and not checkpoint:
    cli.fail(PROG, 'flag --workdir is required (or --checkpoint with --config)')
  overrides = {key: values[key].value for key in overrides_lib.ROUTING_OVERRIDES
               if values[key].value is not None}
  try:
    # A reference V-MoE config file, its overrides applied in its own key names.
    config = values['config'].value
    if config is not None:
      config = reference.resolve(config)
    request = prepare(
        workdir or None, values['step'].value, checkpoint=checkpoint or None,
        dataset=values['dataset'].value,
        split=values['split'].value, data_dir=values['data_dir'].value,
        batch_size=values['batch_size'].value, name=values['name'].value,
        config=config, **overrides)
  except overrides_lib.RoutingOverrideError as e:
    cli.fail(PROG, f'--{e}' if e.key else e)
  except (OSError, ValueError) as e:
    cli.fail(PROG, e)
  try:
    payload = run(request)
  except UsageError as e:
    cli.fail(PROG, e)
  except CheckpointRestoreError as e:
    cli.fail(PROG, e, status=1)
  if jax.process_index() == 0:
    print(format_report(payload))
    if request.path is None:
      print(json.dumps(payload, sort_keys=True), flush=True)   # The results, on stdout.
    else:
      print(f'Wrote {request.path}', flush=True)


def run_cli() -> None:
  """`python -m vmoe_sparse_ot.evaluate`: absl's logging set up, then `main`."""
  from absl import app  # pylint: disable=g-import-not-at-top

  def parse_absl_flags(argv):
    flags.FLAGS(argv[:1])  # absl's own flags (logging) at their defaults; ours parse in main.
    return argv

  app.run(main, flags_parser=parse_absl_flags)


__all__ = ['Request', 'UsageError', 'default_name', 'format_report', 'main',
           'prepare', 'run', 'run_cli']
