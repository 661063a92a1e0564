"""The sharded training loop: init or resume a TrainState, train, log, evaluate, checkpoint.

One `jax.jit` train step, `(TrainState, batch, TrainMetrics) -> (TrainState,
TrainMetrics)`, with the shardings of one TrainState tree over the ('data',
'expert') mesh (set with `jax.set_mesh` so the model's sharding constraints
apply); the same code runs on one device, on fake CPU devices and across
processes. Batches are put on the mesh two steps ahead, and the host reads
metrics only on logging steps and before checkpoints, so it never waits for the
device in between.

The loop body is one step followed by periodic actions (clu `PeriodicCallback`):
the progress line, checkpointing (after checking the state is finite),
evaluation and few-shot transfer. The step itself (`train.step`: loss, mixup,
microsteps) and the evaluation sets (`train.periodic_eval`) live in their own
modules.

Reproducibility: step t draws its keys from `fold_in(root key, t)`, the input
stream is a seeded pipeline positioned by step (see `vmoe_sparse_ot.data.pipeline`),
and checkpoints hold the whole TrainState, so a run killed and restarted ends
with the same parameters as an uninterrupted one.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from clu import periodic_actions

from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot import data as data_lib
from vmoe_sparse_ot import initialization
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn import overrides as model_overrides_lib
from vmoe_sparse_ot import atomic
from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.train import periodic_eval
from vmoe_sparse_ot.train import lock as lock_lib
from vmoe_sparse_ot.train import losses as losses_lib
from vmoe_sparse_ot.train import metrics as metrics_lib
from vmoe_sparse_ot.train import optimizer as optimizer_lib
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import profiling
from vmoe_sparse_ot.train import programs
from vmoe_sparse_ot.train import progress as progress_lib
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train.step import make_step
from vmoe_sparse_ot.train.state import TrainState
from vmoe_sparse_ot.errors import NonFiniteLossError  # pylint: disable=unused-import
from vmoe_sparse_ot.errors import TrainerError  # pylint: disable=unused-import

# Builds the periodic few-shot action of a run, or None: (config, model, mesh,
# metric writer) -> action(step, params, model_state).
FewShotHook = Callable[..., Any]



def _json(tree: Any) -> Any:
  # JSON round trip: tuples become lists, as they come back from the checkpoint.
  return json.loads(json.dumps(tree))


def _stream_meta(dataset, batch_size: int, seed: int) -> dict[str, Any]:
  # Checkpoints from before `sampling` existed were 'stream' and recorded
  # shuffle_buffer: a 'stream' run records exactly that, so they still resume.
  meta = {'name': dataset.name, 'split': dataset.train_split, 'batch_size': batch_size,
          'seed': seed}
  if dataset.sampling == 'stream':
    return meta | {'shuffle_buffer': int(dataset.shuffle_buffer)}
  return meta | {'sampling': dataset.sampling}


def run_meta(config: ml_collections.ConfigDict, abstract_params: Any) -> dict[str, Any]:
  """Checkpoint metadata fixed for the run (the step is added at each save)."""
  return {
      'model_config': nn.model_config.without_compute_keys(_json(config.model.to_dict()),
                                                     only_defaults=True),
      'param_shapes': checkpoints.param_shapes(abstract_params),
      # What fixes the meaning of "global batch t" of the training stream.
      'data': _stream_meta(config.dataset, int(config.batch_size), int(config.seed)),
      # Keys added later are left out at their defaults, so the record is what
      # it was before they existed and older workdirs still resume.
      'optimizer': {k: v for k, v in _json(config.optimizer.to_dict()).items()
                    if not (k in ('freeze', 'mu_dtype') and v is None)
                    and not (k == 'param_naming' and v == 'ours')},
      'schedule': _json(config_lib.schedule_record(config.schedule.to_dict())),
      'train_steps': int(config.train_steps),
  }


def _per_process(global_size: int, what: str, num_devices: int) -> int:
  if global_size % jax.process_count() or global_size % num_devices:
    raise ValueError(f'config.{what}={global_size} must be a multiple of the number of '
                     f'devices ({num_devices}) and of processes ({jax.process_count()})')
  return global_size // jax.process_count()


def _dataset(config, split: str, batch_size: int, training: bool, start_step: int = 0):
  ds = config.dataset
  return data_lib.make_dataset(
      ds.name, split, batch_size=batch_size, image_size=ds.image_size, channels=ds.channels,
      training=training, data_dir=ds.data_dir, shuffle_seed=config.seed,
      shuffle_buffer=ds.shuffle_buffer, process_index=jax.process_index(),
      process_count=jax.process_count(), start_step=start_step, augment=ds.augment,
      pp=ds.pp_train if training else ds.pp_eval, sampling=ds.sampling)


def with_metrics(step_fn):
  """The train step of a `make_step` function: its values merged into the metrics."""

  def train_step(state: TrainState, batch, metrics: metrics_lib.TrainMetrics):
    new_state, values = step_fn(state, batch)
    return new_state, metrics.update(values, new_state.step)

  return train_step


def evaluate(eval_step, params, dataset, sharding, model_state=None) -> dict[str, float]:
  """Loss and top-1 accuracy over every real (mask=True) example of `dataset`, and,
  for an eval step that reports routing (a V-MoE), `dropped_fraction`: the real
  tokens no expert processed, over all MoE layers.

  `model_state`: the TrainState's (the current router state; {} or None: none).
  """
  totals = None
  for batch in parallel.prefetch_to_mesh(dataset.as_numpy_iterator(), sharding):
    # Summed on device; fetched once at the end.
    out = eval_step(params, batch, model_state or {})
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  totals = jax.device_get(totals) if totals else {}
  routing = totals.pop('routing', None)
  ensemble = totals.pop('ensemble', None)
  totals = {k: float(v) for k, v in totals.items()}
  count = max(totals.get('count', 0.0), 1.0)
  result = {'loss': totals.get('loss_sum', 0.0) / count,
            'accuracy': totals.get('correct', 0.0) / count,
            'num_examples': int(totals.get('count', 0.0))}
  if ensemble is not None:  # E³: the ensemble's ECE, each member's loss, accuracy, ECE.
    result.update(periodic_eval.ensemble_metrics(ensemble, count))
  if routing:
    tokens = sum(int(r['tokens']) for r in routing.values())
    result['dropped_fraction'] = sum(int(r['dropped']) for r in routing.values()) / max(
        tokens, 1)
  return result


def eval_model(config: ml_collections.ConfigDict, model):
  """The model of the evaluations during training: `model`, or the one of
  `config.evaluate.model_overrides` over config.model (the same parameters)."""
  overrides = config.evaluate.get('model_overrides') or {}
  if not overrides:
    return model
  overrides = overrides.to_dict() if hasattr(overrides, 'to_dict') else dict(overrides)
  model_config = model_overrides_lib.apply_overrides(config.model, overrides,
                                                     'config.evaluate.model_overrides')
  changed = ', '.join(f'{k}={v!r}' for k, v in model_overrides_lib.leaves(overrides).items())
  logging.info('Evaluating with config.evaluate.model_overrides: %s', changed)
  return nn.build_model(model_config)


def _tokens_per_image(model, image_size: int) -> int | None:
  """N, the tokens of one image in the encoder (None for a dense model)."""
  if not model.moe_layers:
    return None
  ph, pw = model.patch_size
  return (image_size // ph) * (image_size // pw) + int(model.classifier == 'token')


def _write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """WORKDIR/config.json: the resolved config of this run (rewritten on resume)."""
  if jax.process_index() > 0:
    return
  atomic.write_json(os.path.join(workdir, workdir_layout.CONFIG), config.to_dict(), sort_keys=True,
                    default=str)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: list[Any] | None = None,
                       allow_schedule_change: bool = False,
                       fewshot: FewShotHook | None = None) -> dict[str, Any]:
  """Trains `config` in `workdir`, resuming from its newest checkpoint that restores.

  `devices` (default: all) builds the mesh; tests pass a subset to compare layouts.
  `allow_schedule_change`: resume even if `train_steps` or `config.schedule`
  differ from the checkpoint's (otherwise refused, naming the change).
  `fewshot`: builds periodic few-shot evaluation, `fewshot(config, model, mesh,
  writer)` -> `action(step, params, model_state)` or None (the command line passes
  `evaluate.transfer.periodic_fewshot`); needed when config.fewshot.every_steps > 0.

  Returns a summary: final evaluation metrics, the final step, steady-state
  throughput, the mean training loss of the last logging interval
  (`train_loss_last_interval_mean`; `final_train_loss` is the same value),
  `train_loss_history`, [(step, mean loss of the interval ending there)], and
  `losses`, every step's loss, of this run (these two are not written to
  summary.json). Raises a `TrainerError` with a one-line
  message for a checkpoint that does not fit the config (ResumeMismatchError, a
  ValueError), NaN/Inf values (NonFiniteLossError), a workdir held by another
  trainer (WorkdirLockedError), checkpoints that all fail to restore
  (CheckpointRestoreError) or a failed checkpoint write (CheckpointWriteError).
  """
  config_lib.validate(config)
  if config.fewshot.every_steps > 0 and fewshot is None:
    raise ValueError(
        f'config.fewshot.every_steps={config.fewshot.every_steps}: periodic few-shot needs '
        'train_and_evaluate(..., fewshot=evaluate.transfer.periodic_fewshot) (the command '
        'line passes it), or set it to 0')
  model = nn.build_model(config.model)
  os.makedirs(workdir, exist_ok=True)
  with lock_lib.WorkdirLock(workdir, jax.process_index()):
    return _train_and_evaluate(config, workdir, model, devices, allow_schedule_change,
                               fewshot)


def _train_and_evaluate(config, workdir, model, devices, allow_schedule_change, fewshot):
  num_experts = config.model.encoder.moe.num_experts if config.model.name == 'vit_moe' else 1
  mesh = parallel.make_mesh(config.mesh, devices, num_experts)
  # This run's jitted functions are those of an earlier run in this process
  # with the same config and mesh (`train.programs`): nothing retraced.
  model_parts = (type(model), nn.routers.ROUTERS.get(config.model.encoder.moe.router.name))
  loss_fn = losses_lib.get(config.loss.name)
  run_key = programs.run_key(config, mesh, model_parts + (loss_fn,))
  # The functions built from less than the whole config: shared with runs
  # that differ only elsewhere (`train.programs`).
  keys = {'init': programs.run_key(config, mesh, model_parts, only=programs.INIT_FROM),
          'eval': programs.run_key(config, mesh, model_parts + (loss_fn,),
                                   only=programs.EVAL_FROM),
          'mesh': programs.run_key(config, mesh, only=()), 'run': run_key}
  batch_size = _per_process(config.batch_size, 'batch_size', mesh.size)
  eval_batch_size = _per_process(config.eval_batch_size, 'eval_batch_size', mesh.size)
  ds_cfg = config.dataset
  image_shape = (1, ds_cfg.image_size, ds_cfg.image_size, ds_cfg.channels)

  init_key, root_key = jax.random.split(jax.random.key(config.seed))

  # Jitted: the abstract shapes and the initializing programs below share one
  # trace of the model's init.
  @jax.jit
  def init_variables(key):  # (params, model_state), see nn.router_state
    params_key, gating_key, dropout_key = jax.random.split(key, 3)
    return nn.router_state.split(model.init(
        {'params': params_key, 'gating': gating_key, 'dropout': dropout_key},
        jnp.zeros(image_shape), train=False))

  init_params = lambda key: init_variables(key)[0]

  schedule = optimizer_lib.make_schedule(config.schedule, int(config.train_steps))
  abstract_params = programs.get(keys['init'], 'abstract_params',
                                 lambda: jax.eval_shape(init_params, init_key))
  tx = optimizer_lib.make_optimizer(config.optimizer, schedule, abstract_params)
  frozen = optimizer_lib.frozen_names(abstract_params, config.optimizer.freeze,
                                      config.optimizer.param_naming)
  if frozen:
    logging.info('optimizer.freeze keeps %d parameter arrays fixed: %s', len(frozen),
                 ', '.join(frozen[:6]) + (', ...' if len(frozen) > 6 else ''))

  def init_state():
    params, model_state = init_variables(init_key)
    return state_lib.create(params, tx, root_key, model_state)

  abstract_state = programs.get(keys['init'], 'abstract_state',
                                lambda: jax.eval_shape(init_state))
  state_sharding = state_lib.shardings_on_mesh(mesh, tx, abstract_state)
  params_sharding = state_sharding.params

  meta = run_meta(config, abstract_params)
  ckpt = checkpoints.Checkpointer(
      workdir, keep=config.checkpoint.keep, async_save=config.checkpoint.async_save,
      keep_steps_multiple_of=int(config.checkpoint.get('keep_steps_multiple_of', 0)))
  changes = []

  def check_meta(saved):
    checkpoints.check_compatible(saved, meta['model_config'], abstract_params, ckpt.directory)
    changes[:] = checkpoints.check_resume(saved, meta, ckpt.directory,
                                          allow_schedule_change=allow_schedule_change)

  failed = True
  try:
    with jax.set_mesh(mesh):
      state, _ = ckpt.restore(state_lib.with_shardings(abstract_state, state_sharding),
                                  check_meta)
      if state is None:
        if config.initialization.path is None:
          state = programs.get(keys['init'], 'init_state', lambda: jax.jit(
              init_state, out_shardings=state_sharding))()
        else:
          # Jitted: eagerly, model.init compiles each of its ops on its own
          # (the tiny test model: ~100 small programs, several seconds).
          params = initialization.initialize_sharded(
              programs.get(keys['init'], 'init_params', lambda: jax.jit(init_params))(init_key),
              config.initialization, params_sharding,
              num_prefix_tokens=int(config.model.classifier == 'token'),
              log=lambda line: logging.info('%s', line))
          # Router state (topk_bias's bias) is not in the source: it starts fresh.
          model_state = programs.get(keys['init'], 'init_model_state', lambda: jax.jit(
              lambda: init_variables(init_key)[1]))()
          state = programs.get(keys['init'], 'create_state', lambda: jax.jit(
              lambda p, m: state_lib.create(p, tx, root_key, m),
              out_shardings=state_sharding))(params, model_state)
        start_step = 0
      else:
        start_step = int(jax.device_get(state.step))
        logging.info('Resumed from step %d of %s', start_step, ckpt.directory)
        if changes:
          logging.warning('Resuming with a changed schedule (allowed): %s', '; '.join(changes))
      summary = _train_loop(config, workdir, model, mesh, tx, schedule, ckpt, state,
                            start_step, keys=keys, meta=meta, state_sharding=state_sharding,
                            batch_sizes=(batch_size, eval_batch_size), fewshot=fewshot)
    failed = False
    return summary
  finally:
    # Waits for a save in flight; its failure must not hide the error in flight.
    with contextlib.suppress(TrainerError) if failed else contextlib.nullcontext():
      ckpt.close()


def _train_loop(config, workdir, model, mesh, tx, schedule, ckpt, state, start_step, *,
                keys, meta, state_sharding, batch_sizes, fewshot):
  """Steps `start_step + 1 .. train_steps`, each followed by the periodic actions.
  keys: the `programs.run_key`s of the run ('run') and of the functions built from
  less ('init', 'eval', 'mesh')."""
  run_key = keys['run']
  batch_size, eval_batch_size = batch_sizes
  train_steps = int(config.train_steps)
  ds_cfg = config.dataset
  replicated = parallel.replicated(mesh)
  batch_sharding = parallel.batch_sharding(mesh)
  num_params = sum(int(np.prod(s)) for s in meta['param_shapes'].values())
  logging.info('Model %s with %.2fM parameters, router %s; mesh %s; %d process(es)',
               config.model.name, num_params / 1e6, config.model.encoder.moe.router.name,
               dict(mesh.shape), jax.process_count())

  _write_config(config, workdir)
  writer = metrics_lib.make_writer(workdir, resume_step=start_step)
  if start_step == 0:
    writer.write_hparams({k: v for k, v in config_lib.flatten(config.to_dict()).items()
                          if isinstance(v, (int, float, str, bool))})
  # The model of config.evaluate.model_overrides (e.g. another capacity factor),
  # for the periodic and the final evaluations and periodic few-shot.
  evaluated = eval_model(config, model)
  eval_step = programs.get(keys['eval'], 'eval_step', lambda: jax.jit(
      periodic_eval.make_eval_step(
          evaluated, config.loss.name,
          num_tokens=_tokens_per_image(evaluated, int(ds_cfg.image_size))),
      in_shardings=(state_sharding.params, batch_sharding, state_sharding.model_state),
      out_shardings=replicated))
  eval_sets = periodic_eval.eval_sets(config)
  eval_datasets = periodic_eval.make_datasets(config, eval_sets, eval_batch_size)

  def run_eval(state):  # {set name: result}; '' is config.dataset.eval_split.
    return periodic_eval.evaluate_all(
        lambda p, ds: evaluate(eval_step, p, ds, batch_sharding, state.model_state),
        state.params, eval_datasets)

  batches = parallel.prefetch_to_mesh(
      _dataset(config, ds_cfg.train_split, batch_size, training=True,
               start_step=start_step).as_numpy_iterator(), batch_sharding)

  summary: dict[str, Any] = {'step': start_step}
  eval_results: list[dict[str, float]] = []
  profiler = profiling.StepProfiler(config.profile, workdir)
  try:
    if start_step < train_steps:
      first_batch = next(batches)
      batches = itertools.chain([first_batch], batches)
      # Jitted, so that the metric names' shapes and the train step share one
      # trace of it (nested in the train step, XLA inlines it).
      step_fn = jax.jit(make_step(model, tx, float(config.label_smoothing),
                                  int(config.microsteps), config.loss.name,
                                  float(config.mixup.p), config.mixup.granularity,
                                  int(config.mixup.size)))
      names = programs.get(run_key, 'metric_names', lambda: sorted(
          jax.eval_shape(step_fn, state, first_batch)[1]))
      empty_metrics = programs.get(run_key, 'empty_metrics', lambda: jax.jit(
          lambda: metrics_lib.TrainMetrics.empty(names, int(config.log_every_steps)),
          out_shardings=replicated))
      compiles = not programs.has(run_key, 'train_step')
      train_step = programs.get(run_key, 'train_step', lambda: jax.jit(
          with_metrics(step_fn), in_shardings=(state_sharding, batch_sharding, replicated),
          out_shardings=(state_sharding, replicated), donate_argnums=(0, 2)))
      progress = progress_lib.ProgressLogger(
          first_step=start_step + 1, total_steps=train_steps,
          every_steps=int(config.log_every_steps), batch_size=int(config.batch_size),
          learning_rate=schedule, writer=writer, last_good=ckpt.last_good,
          compiles=compiles)
      # Few-shot too reads the evaluation model (its features), as the reference does.
      periodic_fewshot = fewshot(config, evaluated, mesh, writer) if fewshot else None
      actions = _periodic_actions(config, writer, ckpt, meta, progress, run_eval, eval_sets,
                                  periodic_fewshot, replicated, keys['mesh'])
      metrics = empty_metrics()
      for step in range(start_step + 1, train_steps + 1):
        profiler(step, state.step)
        with jax.profiler.StepTraceAnnotation('train', step_num=step):
          state, metrics = train_step(state, next(batches), metrics)
        if progress.should_log(step):
          progress.log(step, metrics)
          metrics = empty_metrics()
        for action in actions.values():
          action(step, state=state, metrics=metrics)
        summary['step'] = step
      eval_results.append(actions['evaluate'].get_last_callback_result())
      summary.update(progress.summary())
    if not eval_results:  # Nothing left to train: evaluate the restored params.
      eval_results.append(run_eval(state))
      periodic_eval.log_results(summary['step'], eval_results[-1], eval_sets, writer)
  finally:
    profiler.close()
    writer.close()

  summary['eval'] = eval_results[-1][periodic_eval.DEFAULT_NAME]
  if len(eval_results[-1]) > 1:
    summary['eval_datasets'] = {name: result for name, result in eval_results[-1].items()
                                if name != periodic_eval.DEFAULT_NAME}
  summary.setdefault('train_loss_history', [])
  summary.setdefault('losses', [])  # Nothing was trained.
  if jax.process_index() == 0:
    atomic.write_json(os.path.join(workdir, workdir_layout.SUMMARY),
                      {k: v for k, v in summary.items()
                       if k not in ('train_loss_history', 'losses')})
  return summary


def _periodic_actions(config, writer, ckpt, meta, progress, run_eval, eval_sets, fewshot,
                      replicated, mesh_key):
  """{'checkpoint', 'evaluate'[, 'fewshot']: clu PeriodicCallback}, in the order they run.

  Each is called after every step as `action(step, state=..., metrics=...)`;
  `['evaluate'].get_last_callback_result()` is the latest eval results, {eval set
  name: result} (`train.periodic_eval`).
  """
  train_steps = int(config.train_steps)
  all_finite = programs.get(mesh_key, 'all_finite', lambda: jax.jit(
      state_lib.all_finite, out_shardings=replicated))

  def save_checkpoint(step, t, state, metrics):
    del t
    with progress.paused():
      # Never write a non-finite state: the last checkpoint must stay a good one.
      finite, bad = jax.device_get((all_finite(state), metrics.first_nonfinite_step))
      if not finite or bad:
        what = 'training loss or gradient' if bad else 'parameters or optimizer state'
        # Non-finite parameters after `step` make the loss of step + 1 non-finite.
        raise NonFiniteLossError(f'Non-finite {what} at step {int(bad) or step}; stopping. '
                                 f'{ckpt.last_good(int(bad) or step + 1)}')
      ckpt.save(step, state, dict(meta, step=step))

  def evaluate_params(step, t, state, metrics):
    del t, metrics
    with progress.paused():
      start = time.monotonic()
      results = run_eval(state)
      periodic_eval.log_results(step, results, eval_sets, writer, time.monotonic() - start)
    return results

  def few_shot(step, t, state, metrics):
    del t, metrics
    with progress.paused():
      # PeriodicFewShot keeps its own schedule; the router state as evaluation's.
      fewshot(step, state.params, state.model_state)

  actions = {
      'checkpoint': periodic_actions.PeriodicCallback(
          every_steps=int(config.checkpoint.every_steps), on_steps=[train_steps],
          callback_fn=save_checkpoint),
      'evaluate': periodic_actions.PeriodicCallback(
          every_steps=int(config.eval_every_steps) or None, on_steps=[train_steps],
          callback_fn=evaluate_params),
  }
  if fewshot is not None:
    actions['fewshot'] = periodic_actions.PeriodicCallback(every_steps=1, callback_fn=few_shot)
  return actions
