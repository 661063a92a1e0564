"""Few-shot linear transfer of a saved checkpoint, without command-line flags.

`run(config, workdir, step)` restores a checkpoint, builds its model, evaluates
`config.fewshot`'s datasets with `evaluate.transfer`'s protocol and writes
WORKDIR/fewshot/results.json; `format_table` is its text table, `check_config`
and `check_checkpoint` the checks that come before it. `run_command` is all three as a command line
reports them: `python -m vmoe_sparse_ot.fewshot` calls it behind its flags, and
`python -m vmoe_sparse_ot.quickstart` after training, in the same process (this
module defines no flags, so it can sit beside another command's).
"""
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
from jax.sharding import PartitionSpec

from vmoe_sparse_ot import atomic
from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import nn
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot.errors import CheckpointMismatchError
from vmoe_sparse_ot.config import cli
from vmoe_sparse_ot.evaluate import transfer
from vmoe_sparse_ot.evaluate.checkpoint_config import describe_model
from vmoe_sparse_ot.evaluate.checkpoint_config import read_checkpoint_meta
from vmoe_sparse_ot.nn.abstract_init import abstract_variables
from vmoe_sparse_ot.train import periodic_eval
from vmoe_sparse_ot.train.run_record import resolve_model_config
from vmoe_sparse_ot.trees import shape_differences

RESULTS_FILE = workdir_layout.FEWSHOT_RESULTS


def check_params_match(params: Any, model, config: ml_collections.ConfigDict) -> None:
  """Raises CheckpointMismatchError listing parameters whose shapes differ from the model's."""
  ds = config.dataset
  expected = abstract_variables(model, (ds.image_size, ds.image_size, ds.channels))['params']
  diffs = shape_differences(checkpoints.param_shapes(params), checkpoints.param_shapes(expected),
                            labels=('checkpoint', 'model'))
  if diffs:
    raise CheckpointMismatchError(
        'The checkpoint does not fit config.model (was it trained with another config?): '
        + '; '.join(diffs[:20]) + (f'; ... and {len(diffs) - 20} more' if len(diffs) > 20
                                   else ''))


def run(config: ml_collections.ConfigDict, workdir: str, step: int | None = None, *,
        use_checkpoint_config: bool = False) -> dict:
  """Evaluates checkpoint `step` (latest if None) of `workdir`; returns what it writes.

  Raises:
    FileNotFoundError: no checkpoint (for `step`) under `workdir`.
    CheckpointMismatchError: `config.model` differs from the checkpoint's model
      config (and `use_checkpoint_config` is False), or its parameters do not fit.
    transfer.DatasetError: a dataset of `config.fewshot.datasets` cannot be loaded.
  """
  params, meta, step = checkpoints.restore_params_with_meta(workdir, step)
  config = _model_config(config, workdir, meta, step, use_checkpoint_config)
  model = nn.build_model(config.model)
  check_params_match(params, model, config)
  # The training layout: expert parameters split over 'expert', the rest replicated.
  num_experts = config.model.encoder.moe.num_experts if config.model.name == 'vit_moe' else 1
  mesh = parallel.make_mesh(config.mesh, num_experts=num_experts)
  params = jax.device_put(params, parallel.param_shardings(
      mesh, params, [(nn.EXPERT_PARAMS_REGEX, PartitionSpec('expert'))]))
  # The router state the checkpoint routes with (topk_bias's bias), on every device.
  image_shape = (config.dataset.image_size, config.dataset.image_size, config.dataset.channels)
  model_state = jax.device_put(
      nn.router_state.for_model(model, image_shape,
                                checkpoints.restore_model_state(workdir, step)),
      parallel.replicated(mesh))
  # The model of the evaluations during training (config.evaluate.model_overrides,
  # e.g. another capacity factor), whose features periodic few-shot reads.
  periodic_eval.log_eval_overrides(config)
  evaluator = transfer.make_evaluator(config, periodic_eval.eval_model(config, model),
                                      mesh=mesh)
  results = evaluator.run(params, model_state)
  payload = {
      'workdir': os.path.abspath(workdir),
      'step': int(step),
      'model': describe_model(config.model),
      'model_config': json.loads(json.dumps(config.model.to_dict())),
      'protocol': evaluator.protocol,
      'metrics': transfer.metrics_from_results(results),
      'datasets': results,
  }
  if jax.process_index() == 0:
    atomic.write_json(os.path.join(workdir, RESULTS_FILE), payload)
  return payload


def _model_config(config, workdir: str, meta: dict, step: int, use_checkpoint_config: bool):
  """`config` with the model the checkpoint's metadata allows (`resolve_model_config`)."""
  return resolve_model_config(
      config, meta, use_checkpoint_config=use_checkpoint_config,
      where=f'checkpoint step {step} in {checkpoints.checkpoint_dir(workdir)}')


def check_checkpoint(config: ml_collections.ConfigDict, workdir: str, step: int | None = None,
                     *, use_checkpoint_config: bool = False) -> None:
  """From the checkpoint's metadata alone (no arrays), raises ValueError naming the
  flag or key: `workdir` or its checkpoint `step` missing (`read_checkpoint_meta`), or
  `config.model` not the checkpoint's model (without `use_checkpoint_config`), or a
  WORKDIR/fewshot that cannot be written (refused now rather than after the evaluation)."""
  meta, found = read_checkpoint_meta(workdir, step)
  _model_config(config, workdir, meta, found, use_checkpoint_config)
  config_lib.check_directory(os.path.dirname(os.path.join(workdir, RESULTS_FILE)), '--workdir')


def format_table(payload: dict) -> str:
  """A text table: dataset, shots, top-1 % (mean ± std over seeds), chosen log2 L2 per seed."""
  num_seeds = len(payload['protocol']['seeds'])
  rows = [('dataset', 'shots', 'top-1 %', 'log2 L2 per seed')]
  for key, ds in payload['datasets'].items():
    for shot, r in ds['shots'].items():
      rows.append((key, str(shot),
                   f"{100 * r['accuracy_mean']:6.2f} ± {100 * r['accuracy_std']:5.2f}",
                   ','.join(f'{np.log2(v):g}' for v in r['l2_reg'])))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
  lines.insert(1, '  '.join('-' * w for w in widths))
  model = payload.get('model') or {}
  router = f", router {model['router']}" if model.get('router') else ''
  selection = payload['protocol']['l2_selection']
  if selection == 'reference':
    chosen = ("L2 chosen by 'reference', the reference V-MoE code's rule: on the test "
              'split, one per shot for every dataset and seed')
  else:
    chosen = f'L2 chosen by {selection} on the few-shot examples'
  title = (f"Few-shot linear transfer of {payload['workdir']} at step {payload['step']} "
           f"({model.get('name', 'model')}{router}; "
           f'top-1 on the test split, mean ± std over {num_seeds} seed(s); {chosen})')
  return '\n'.join([title] + lines)


def check_config(config: ml_collections.ConfigDict, *, devices: bool = True) -> None:
  """Raises ValueError or OSError naming the key when `config` cannot run the few-shot
  evaluation: its values, data_dir, every few-shot dataset and, with `devices`, the
  batch over the devices (False: before jax.distributed starts, which must come first)."""
  config_lib.validate(config)
  if config.dataset.data_dir:
    config_lib.check_directory(config.dataset.data_dir, 'config.dataset.data_dir')
  # Before the checkpoint is read or a model built: every few-shot dataset exists.
  config_lib.check_datasets(config, training=False, fewshot=True)
  if devices and config.fewshot.batch_size % jax.device_count():
    raise ValueError(f'config.fewshot.batch_size={config.fewshot.batch_size}: must be a '
                     f'multiple of the number of devices ({jax.device_count()})')


def run_command(prog: str, config: ml_collections.ConfigDict, workdir: str,
                step: int | None = None, *, use_checkpoint_config: bool = False) -> None:
  """`check_config`, `run`, then the table and the results path on process 0's stdout.

  A user's mistake is one line naming `prog` and exit status 2, before any array is
  read: the config, a missing workdir or checkpoint step, a config whose model is
  not the checkpoint's. A checkpoint whose arrays do not restore, or a dataset that
  cannot be loaded, exits with status 1 and the whole message.
  """
  try:
    check_config(config)
    check_checkpoint(config, workdir, step, use_checkpoint_config=use_checkpoint_config)
  except (OSError, ValueError) as e:
    cli.fail(prog, e)
  try:
    payload = run(config, workdir, step, use_checkpoint_config=use_checkpoint_config)
  except CheckpointMismatchError as e:  # parameter shapes (a checkpoint without a model config)
    cli.fail(prog, e)
  except (FileNotFoundError, transfer.DatasetError) as e:
    cli.fail(prog, e, status=1, first_line_only=False)
  if jax.process_index() == 0:
    print(format_table(payload))
    print(f'Wrote {os.path.join(workdir, RESULTS_FILE)}', flush=True)
