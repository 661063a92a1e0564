"""The sharded training loop: init or resume, train, log, evaluate, checkpoint.

One `jax.jit` train step with explicit in/out shardings over the ('data', 'expert')
mesh (set with `jax.set_mesh` so the model's sharding constraints apply); the
same code runs on one device, on fake CPU devices and across processes.

Reproducibility: the per-step RNG is `fold_in(root_key, step)`, the input stream
is a seeded pipeline positioned by step (see `vmoe_sparse_ot.data.pipeline`), and
checkpoints hold params, optimizer state, the root key and the data position, so
a run killed and restarted ends with the same parameters as an uninterrupted one.
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from clu import metric_writers
from jax.sharding import PartitionSpec as P

from vmoe_sparse_ot import data as data_lib
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.train import checkpoints
from vmoe_sparse_ot.train import config as config_lib
from vmoe_sparse_ot.train import optimizer as optimizer_lib
from vmoe_sparse_ot.train import partitioning


class NonFiniteLossError(FloatingPointError):
  """Training produced a NaN/Inf loss or gradient; the message names the step."""


def _model_config_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  # JSON round trip: tuples become lists, as they come back from the checkpoint.
  return json.loads(json.dumps(config.model.to_dict()))


def _data_position_meta(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What fixes the meaning of "global batch t" of the training stream."""
  return {'name': config.dataset.name, 'split': config.dataset.train_split,
          'batch_size': int(config.batch_size), 'seed': int(config.seed),
          'shuffle_buffer': int(config.dataset.shuffle_buffer)}


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
      process_count=jax.process_count(), start_step=start_step, augment=ds.augment)


def _flatten_routing(routing: dict[str, dict[str, Any]]) -> dict[str, Any]:
  return {f'routing/{layer}/{name}': value
          for layer, metrics in routing.items() for name, value in metrics.items()}


def make_train_step(model, tx: optax.GradientTransformation, schedule: optax.Schedule):
  """(params, opt_state, batch, root_key, step) -> (params, opt_state, metrics)."""

  def train_step(params, opt_state, batch, root_key, step):
    dropout_key, gating_key = jax.random.split(jax.random.fold_in(root_key, step))

    def loss_fn(p):
      logits, aux = model.apply({'params': p}, batch['image'], train=True,
                                rngs={'dropout': dropout_key, 'gating': gating_key})
      ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label']).mean()
      return ce + aux['auxiliary_loss'], (ce, logits, aux)

    (loss, (ce, logits, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics = {
        'loss': loss, 'cross_entropy': ce, 'auxiliary_loss': aux['auxiliary_loss'],
        'accuracy': jnp.mean(jnp.argmax(logits, -1) == batch['label']),
        'grad_norm': optax.tree.norm(grads), 'learning_rate': schedule(step - 1),
        **_flatten_routing(aux.get('routing', {})),
    }
    return params, opt_state, metrics

  return train_step


def make_eval_step(model):
  """(params, batch) -> sums of loss and correct predictions over unmasked examples."""

  def eval_step(params, batch):
    logits, _ = model.apply({'params': params}, batch['image'], train=False)
    mask = batch['mask'].astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch['label'])
    correct = (jnp.argmax(logits, -1) == batch['label']).astype(jnp.float32)
    return {'loss_sum': jnp.sum(ce * mask), 'correct': jnp.sum(correct * mask),
            'count': jnp.sum(mask)}

  return eval_step


def evaluate(eval_step, params, dataset, sharding) -> dict[str, float]:
  """Loss and top-1 accuracy over every real (mask=True) example of `dataset`."""
  totals = {'loss_sum': 0.0, 'correct': 0.0, 'count': 0.0}
  for batch in dataset.as_numpy_iterator():
    out = jax.device_get(eval_step(params, data_lib.to_global(batch, sharding)))
    for k in totals:
      totals[k] += float(out[k])
  count = max(totals['count'], 1.0)
  return {'loss': totals['loss_sum'] / count, 'accuracy': totals['correct'] / count,
          'num_examples': int(totals['count'])}


def _make_fewshot(config, model, mesh, writer):
  if config.fewshot.every_steps <= 0:
    return None
  try:
    from vmoe_sparse_ot.evaluate import fewshot  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # The evaluate package is optional for training.
    logging.warning('Periodic few-shot disabled: cannot import evaluate.fewshot (%s)', e)
    return None
  evaluator = fewshot.make_evaluator(config, model, mesh=mesh)
  return fewshot.PeriodicFewShot(evaluator, writer, every_steps=config.fewshot.every_steps,
                                 last_step=config.train_steps)


def _format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  return f'{seconds // 3600}h{seconds // 60 % 60:02d}m{seconds % 60:02d}s' if seconds >= 3600 \
      else f'{seconds // 60}m{seconds % 60:02d}s'


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       devices: list[Any] | None = None) -> dict[str, Any]:
  """Trains `config` in `workdir` (resuming from its latest checkpoint).

  `devices` (default: all) builds the mesh; tests pass a subset to compare layouts.
  Returns a summary: final evaluation metrics, the final step, throughput, and the
  per-step training losses of this run (`losses`, not written to summary.json).
  Raises ValueError for a bad config or a checkpoint that does not match it, and
  NonFiniteLossError when the loss or gradient becomes NaN/Inf.
  """
  config_lib.validate(config)
  model = nn.build_model(config.model)
  os.makedirs(workdir, exist_ok=True)
  num_experts = config.model.encoder.moe.num_experts if config.model.name == 'vit_moe' else 1
  mesh = partitioning.make_mesh(config.mesh, devices, num_experts)
  batch_size = _per_process(config.batch_size, 'batch_size', mesh.size)
  eval_batch_size = _per_process(config.eval_batch_size, 'eval_batch_size', mesh.size)
  ds_cfg = config.dataset
  image_shape = (1, ds_cfg.image_size, ds_cfg.image_size, ds_cfg.channels)

  # Parameters, optimizer state and RNG, laid out on the mesh.
  seed_key = jax.random.key(config.seed)
  init_key, root_key = jax.random.split(seed_key)

  def init_params(key):
    params_key, gating_key, dropout_key = jax.random.split(key, 3)
    variables = model.init({'params': params_key, 'gating': gating_key,
                            'dropout': dropout_key}, jnp.zeros(image_shape), train=False)
    return variables['params']

  abstract_params = jax.eval_shape(init_params, init_key)
  rules = [(nn.EXPERT_PARAMS_REGEX, P('expert'))]
  params_sharding = partitioning.param_shardings(mesh, abstract_params, rules)
  schedule = optimizer_lib.make_schedule(config.schedule, int(config.train_steps))
  tx = optimizer_lib.make_optimizer(config.optimizer, schedule, abstract_params)
  abstract_opt_state = jax.eval_shape(tx.init, abstract_params)
  opt_sharding = partitioning.opt_state_shardings(tx, abstract_opt_state, params_sharding, mesh)
  replicated = partitioning.replicated(mesh)
  batch_sharding = partitioning.batch_sharding(mesh)

  ckpt = checkpoints.Checkpointer(workdir, keep=config.checkpoint.keep,
                                  async_save=config.checkpoint.async_save)
  model_config = _model_config_dict(config)
  data_meta = _data_position_meta(config)
  start_step = ckpt.latest_step() or 0
  try:
    with jax.set_mesh(mesh):
      if start_step:
        params, opt_state, root_key = _restore(
            ckpt, start_step, model_config, data_meta, abstract_params, params_sharding,
            abstract_opt_state, opt_sharding, replicated)
      else:
        params = jax.jit(init_params, out_shardings=params_sharding)(init_key)
        opt_state = jax.jit(tx.init, out_shardings=opt_sharding)(params)
        # A jit, not device_put: the mesh may span devices of other processes.
        root_key = jax.jit(lambda k: k, out_shardings=replicated)(root_key)
      return _train_loop(
          config, workdir, model, mesh, tx, schedule, ckpt, params, opt_state, root_key,
          start_step, meta={'model_config': model_config, 'data': data_meta,
                            'param_shapes': checkpoints.param_shapes(abstract_params)},
          shardings=(params_sharding, opt_sharding, replicated, batch_sharding),
          batch_sizes=(batch_size, eval_batch_size))
  finally:
    ckpt.close()  # Waits for a save in flight.


def _restore(ckpt, step, model_config, data_meta, abstract_params, params_sharding,
             abstract_opt_state, opt_sharding, replicated):
  """(params, opt_state, root_key) of checkpoint `step`, after checking it fits."""
  meta = ckpt.restore_meta(step)
  checkpoints.check_compatible(meta, model_config, abstract_params, ckpt.directory)
  if meta.get('data') != data_meta:
    raise ValueError(
        f'The checkpoint in {ckpt.directory} was trained on a different input stream '
        f'{meta.get("data")}; this config gives {data_meta}. Use a fresh --workdir.')
  with_sharding = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
  abstract_state = {
      'opt_state': jax.tree.map(with_sharding, abstract_opt_state, opt_sharding),
      'rng': jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=replicated)}
  params, state = ckpt.restore(
      step, jax.tree.map(with_sharding, abstract_params, params_sharding), abstract_state)
  logging.info('Resumed from step %d of %s', step, ckpt.directory)
  return params, state['opt_state'], jax.random.wrap_key_data(state['rng'])


def _train_loop(config, workdir, model, mesh, tx, schedule, ckpt, params, opt_state,
                root_key, start_step, *, meta, shardings, batch_sizes):
  """Steps `start_step + 1 .. train_steps`: log, evaluate, few-shot, checkpoint."""
  params_sharding, opt_sharding, replicated, batch_sharding = shardings
  batch_size, eval_batch_size = batch_sizes
  train_steps = int(config.train_steps)
  ds_cfg = config.dataset
  num_params = sum(int(np.prod(s)) for s in meta['param_shapes'].values())
  logging.info('Model %s with %.2fM parameters, router %s; mesh %s; %d process(es)',
               config.model.name, num_params / 1e6, config.model.encoder.moe.router.name,
               dict(mesh.shape), jax.process_count())

  train_step = jax.jit(
      make_train_step(model, tx, schedule),
      in_shardings=(params_sharding, opt_sharding, batch_sharding, replicated, replicated),
      out_shardings=(params_sharding, opt_sharding, replicated), donate_argnums=(0, 1))
  eval_step = jax.jit(make_eval_step(model), in_shardings=(params_sharding, batch_sharding),
                      out_shardings=replicated)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0, asynchronous=False)
  if start_step == 0:
    writer.write_hparams({k: v for k, v in config_lib.flatten(config.to_dict()).items()
                          if isinstance(v, (int, float, str, bool))})
  fewshot = _make_fewshot(config, model, mesh, writer)
  eval_ds = _dataset(config, ds_cfg.eval_split, eval_batch_size, training=False)
  train_iter = iter(_dataset(config, ds_cfg.train_split, batch_size, training=True,
                             start_step=start_step).as_numpy_iterator())

  summary: dict[str, Any] = {'step': start_step, 'losses': []}
  interval_start, interval_steps = time.time(), 0
  steady = {'time': 0.0, 'steps': 0}  # Throughput after the first (compiling) interval.
  eval_metrics = None
  for step in range(start_step + 1, train_steps + 1):
    batch = data_lib.to_global(next(train_iter), batch_sharding)
    params, opt_state, metrics = train_step(params, opt_state, batch, root_key,
                                            jnp.asarray(step, jnp.int32))
    loss, grad_norm = (float(v) for v in jax.device_get((metrics['loss'],
                                                          metrics['grad_norm'])))
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
      writer.flush()
      ckpt.wait()
      last_good = ckpt.latest_step()
      raise NonFiniteLossError(
          f'Non-finite training loss {loss} (gradient norm {grad_norm}) at step {step}; '
          'stopping. The last good checkpoint is '
          + (f'step {last_good} in {ckpt.directory}.' if last_good else
             'none (no step was saved yet).'))
    summary['losses'].append(loss)
    interval_steps += 1

    if step % config.log_every_steps == 0 or step == train_steps:
      elapsed = time.time() - interval_start
      steps_per_sec = interval_steps / max(elapsed, 1e-9)
      if step - interval_steps > start_step:
        steady['time'] += elapsed
        steady['steps'] += interval_steps
      scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
      scalars.update({'loss': float(np.mean(summary['losses'][-interval_steps:])),
                      'steps_per_sec': steps_per_sec,
                      'images_per_sec': steps_per_sec * config.batch_size})
      writer.write_scalars(step, scalars)
      logging.info('step %d/%d: loss %.4f, train acc %.3f, %.2f steps/s, %.0f images/s, '
                   'ETA %s', step, train_steps, scalars['loss'], scalars['accuracy'],
                   steps_per_sec, scalars['images_per_sec'],
                   _format_duration((train_steps - step) / max(steps_per_sec, 1e-9)))
      interval_start, interval_steps = time.time(), 0

    pause = time.time()  # Evaluation stays out of steps/s.
    if step == train_steps or (config.eval_every_steps and
                               step % config.eval_every_steps == 0):
      eval_metrics = evaluate(eval_step, params, eval_ds, batch_sharding)
      writer.write_scalars(step, {f'eval/{k}': v for k, v in eval_metrics.items()})
      logging.info('eval at step %d on %s: loss %.4f, top-1 accuracy %.4f (%d examples, '
                   '%.1fs)', step, ds_cfg.eval_split, eval_metrics['loss'],
                   eval_metrics['accuracy'], eval_metrics['num_examples'],
                   time.time() - pause)
    if fewshot is not None:
      fewshot(step, params)
    interval_start += time.time() - pause

    if step % config.checkpoint.every_steps == 0 or step == train_steps:
      ckpt.save(step, params, {'opt_state': opt_state, 'rng': jax.random.key_data(root_key)},
                dict(meta, step=step))
    summary['step'] = step

  if eval_metrics is None:  # Nothing left to train: evaluate the restored params.
    eval_metrics = evaluate(eval_step, params, eval_ds, batch_sharding)
  writer.flush()

  summary['eval'] = eval_metrics
  if summary['losses']:
    summary['final_train_loss'] = summary['losses'][-1]
  if steady['steps']:
    summary['steps_per_sec'] = steady['steps'] / steady['time']
    summary['images_per_sec'] = summary['steps_per_sec'] * config.batch_size
  if jax.process_index() == 0:
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
      json.dump({k: v for k, v in summary.items() if k != 'losses'}, f, indent=2)
  return summary
