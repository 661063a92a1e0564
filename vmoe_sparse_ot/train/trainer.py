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
import os
from typing import Any, Callable

import jax
import ml_collections
import numpy as np
from absl import logging

from vmoe_sparse_ot import atomic
from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import data as data_lib
from vmoe_sparse_ot import initialization
from vmoe_sparse_ot import nn
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot.errors import NonFiniteLossError  # pylint: disable=unused-import
from vmoe_sparse_ot.errors import TrainerError
from vmoe_sparse_ot.train import evaluation
from vmoe_sparse_ot.train import hooks
from vmoe_sparse_ot.train import lock as lock_lib
from vmoe_sparse_ot.train import metrics as metrics_lib
from vmoe_sparse_ot.train import periodic_eval
from vmoe_sparse_ot.train import profiling
from vmoe_sparse_ot.train import progress as progress_lib
from vmoe_sparse_ot.train import run as run_lib
from vmoe_sparse_ot.train import run_record
from vmoe_sparse_ot.train.state import TrainState

# Builds the periodic few-shot action of a run, or None: (config, model, mesh,
# metric writer) -> action(step, params, model_state).
FewShotHook = Callable[..., Any]


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
    run = run_lib.build(config, model, devices)
    ckpt = checkpoints.Checkpointer(
        workdir, keep=config.checkpoint.keep, async_save=config.checkpoint.async_save,
        keep_steps_multiple_of=int(config.checkpoint.get('keep_steps_multiple_of', 0)))
    with _closing(ckpt), jax.set_mesh(run.mesh):
      state, start_step = _restore_or_init(run, ckpt, allow_schedule_change)
      return _train(run, workdir, ckpt, state, start_step, fewshot)


@contextlib.contextmanager
def _closing(ckpt):
  """Closes `ckpt` (waiting for a save in flight) on the way out; when an error is
  already on its way, a failed save must not hide it."""
  try:
    yield
  except BaseException:
    with contextlib.suppress(TrainerError):
      ckpt.close()
    raise
  ckpt.close()


def _restore_or_init(run: run_lib.Run, ckpt, allow_schedule_change: bool):
  """(state, its step): the newest checkpoint that restores and fits the run, or the
  step-0 state (from `config.initialization`'s weights when it names any)."""
  changes = []

  def check_record(saved):
    run_record.check_compatible(saved, run.record['model_config'], run.abstract_params,
                                ckpt.directory)
    changes[:] = run_record.check_resume(saved, run.record, ckpt.directory,
                                         allow_schedule_change=allow_schedule_change)

  state, _ = ckpt.restore(state_with_shardings(run), check_record)
  if state is None:
    return _init_state(run), 0
  start_step = int(jax.device_get(state.step))
  logging.info('Resumed from step %d of %s', start_step, ckpt.directory)
  if changes:
    logging.warning('Resuming with a changed schedule (allowed): %s', '; '.join(changes))
  return state, start_step


def state_with_shardings(run: run_lib.Run) -> TrainState:
  """The run's abstract TrainState carrying its shardings, the form Orbax restores into."""
  return run_lib.with_shardings(run.abstract_state, run.state_sharding)


def _init_state(run: run_lib.Run) -> TrainState:
  config, programs = run.config, run.programs
  if config.initialization.path is None:
    return programs.init_state(run.init_key, run.root_key)
  params, model_state = programs.init_variables(run.init_key)
  params = initialization.initialize_sharded(
      params, config.initialization, run.state_sharding.params,
      num_prefix_tokens=int(config.model.classifier == 'token'),
      log=lambda line: logging.info('%s', line))
  # Router state (topk_bias's bias) is not in the source: it starts fresh.
  return programs.create_state(params, model_state, run.root_key)


def _dataset(config, split: str, batch_size: int, training: bool, start_step: int = 0):
  ds = config.dataset
  return data_lib.make_dataset(
      ds.name, split, batch_size=batch_size, image_size=ds.image_size, channels=ds.channels,
      training=training, data_dir=ds.data_dir, shuffle_seed=config.seed,
      shuffle_buffer=ds.shuffle_buffer, process_index=jax.process_index(),
      process_count=jax.process_count(), start_step=start_step, augment=ds.augment,
      pp=ds.pp_train if training else ds.pp_eval, sampling=ds.sampling)


def _write_config(config: ml_collections.ConfigDict, workdir: str) -> None:
  """WORKDIR/config.json: the resolved config of this run (rewritten on resume)."""
  if jax.process_index() > 0:
    return
  atomic.write_json(os.path.join(workdir, workdir_layout.CONFIG), config.to_dict(),
                    sort_keys=True, default=str)


def _train(run: run_lib.Run, workdir: str, ckpt, state: TrainState, start_step: int,
           fewshot: FewShotHook | None) -> dict[str, Any]:
  """Steps `start_step + 1 .. train_steps`, each followed by the hooks; then the final
  evaluation and the summary."""
  last_step = int(run.config.train_steps)
  writer = _open_writer(run, workdir, start_step)
  eval_sets, run_eval = _evaluations(run)
  summary: dict[str, Any] = {'step': start_step}
  profiler = profiling.StepProfiler(run.config.profile, workdir)
  try:
    if start_step < last_step:
      batches, first_batch = _train_batches(run, start_step)
      progress = progress_lib.ProgressLogger(
          steps=range(start_step + 1, last_step + 1),
          every_steps=int(run.config.log_every_steps), learning_rate=run.schedule,
          writer=writer, last_good=ckpt.last_good,
          accounting=run_lib.accounting(run, first_batch), compiles=run.compiles)
      actions = _hooks(run, ckpt, progress, writer, run_eval, eval_sets, fewshot)
      metrics = run.programs.empty_metrics(first_batch)
      for step in range(start_step + 1, last_step + 1):
        profiler(step, state.step)
        with jax.profiler.StepTraceAnnotation('train', step_num=step):
          state, metrics = run.programs.train_step(state, next(batches), metrics)
        if progress.should_log(step):
          progress.log(step, metrics)
          metrics = run.programs.empty_metrics(first_batch)
        for action in actions.values():
          action(step, state=state, metrics=metrics)
        summary['step'] = step
      summary.update(progress.summary())
      results = actions['evaluate'].get_last_callback_result()
    else:  # Nothing left to train: evaluate the restored params.
      results = run_eval(state)
      periodic_eval.log_results(start_step, results, eval_sets, writer)
  finally:
    profiler.close()
    writer.close()
  return _summarize(summary, results, workdir)


def _open_writer(run: run_lib.Run, workdir: str, start_step: int):
  """Logs the run's one-line description, writes WORKDIR/config.json, and returns the
  metric writer (TensorBoard and metrics.jsonl), with the hyperparameters on a
  fresh run."""
  config = run.config
  num_params = sum(int(np.prod(s)) for s in run.record['param_shapes'].values())
  logging.info('Model %s with %.2fM parameters, router %s; mesh %s; %d process(es)',
               config.model.name, num_params / 1e6, config.model.encoder.moe.router.name,
               dict(run.mesh.shape), jax.process_count())
  _write_config(config, workdir)
  writer = metrics_lib.make_writer(workdir, resume_step=start_step)
  if start_step == 0:
    writer.write_hparams({k: v for k, v in config_lib.flatten(config.to_dict()).items()
                          if isinstance(v, (int, float, str, bool))})
  return writer


def _evaluations(run: run_lib.Run):
  """(the eval sets, run_eval(state) -> {set name: result}); '' names
  config.dataset.eval_split."""
  periodic_eval.log_eval_overrides(run.config)
  eval_sets = periodic_eval.eval_sets(run.config)
  eval_datasets = periodic_eval.make_datasets(run.config, eval_sets, run.eval_batch_size)

  def run_eval(state):
    return periodic_eval.evaluate_all(
        lambda params, ds: evaluate(run.programs.eval_step, params, ds, run.batch_sharding,
                                    state.model_state),
        state.params, eval_datasets)

  return eval_sets, run_eval


def _train_batches(run: run_lib.Run, start_step: int):
  """(the training batches from `start_step + 1` on, put on the mesh ahead; the first)."""
  config = run.config
  batches = parallel.prefetch_to_mesh(
      _dataset(config, config.dataset.train_split, run.batch_size, training=True,
               start_step=start_step).as_numpy_iterator(), run.batch_sharding)
  first_batch = next(batches)
  return itertools.chain([first_batch], batches), first_batch


def _hooks(run: run_lib.Run, ckpt, progress, writer, run_eval, eval_sets,
           fewshot: FewShotHook | None) -> dict[str, Any]:
  """{'checkpoint', 'evaluate'[, 'fewshot']: hook}, in the order they run after a step."""
  config, last_step = run.config, int(run.config.train_steps)
  actions = {
      'checkpoint': hooks.checkpoint_every(int(config.checkpoint.every_steps), last_step, ckpt,
                                           run.record, run.programs.all_finite, progress),
      'evaluate': hooks.evaluate_every(int(config.eval_every_steps), last_step, run_eval,
                                       eval_sets, writer, progress)}
  # Few-shot too reads the evaluation model (its features), as the reference does.
  periodic_fewshot = fewshot(config, run.eval_model, run.mesh, writer) if fewshot else None
  if periodic_fewshot is not None:
    actions['fewshot'] = hooks.fewshot_every_step(periodic_fewshot, progress)
  return actions


def _summarize(summary: dict[str, Any], results: dict[str, Any], workdir: str) -> dict[str, Any]:
  """The run's summary with the last evaluation; writes WORKDIR/summary.json."""
  summary['eval'] = results[periodic_eval.DEFAULT_NAME]
  if len(results) > 1:
    summary['eval_datasets'] = {name: result for name, result in results.items()
                                if name != periodic_eval.DEFAULT_NAME}
  summary.setdefault('train_loss_history', [])
  summary.setdefault('losses', [])  # Nothing was trained.
  if jax.process_index() == 0:
    atomic.write_json(os.path.join(workdir, workdir_layout.SUMMARY),
                      {k: v for k, v in summary.items()
                       if k not in ('train_loss_history', 'losses')})
  return summary


def evaluate(eval_step, params, dataset, sharding, model_state=None) -> dict[str, float]:
  """Loss and top-1 accuracy over every real (mask=True) example of `dataset`
  (`train.evaluation.metrics`; an empty one: 0 of 0 examples).

  eval_step: the run's (`Run.programs.eval_step`). `model_state`: the TrainState's
  (the current router state; {} or None: none).
  """
  return evaluation.metrics(evaluation.totals(eval_step, params, dataset, sharding,
                                              model_state))

