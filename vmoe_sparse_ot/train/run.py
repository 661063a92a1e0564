"""What a training run is made of, built once: `build(config)` -> `Run`.

A `Run` holds the model (and the model evaluations use), the ('data', 'expert')
mesh, the schedule and optimizer, the abstract TrainState and its shardings,
the run record (`train.run_record`) and the run's jitted programs: initialize,
train step, eval step and the finiteness check. The trainer only calls them.

The programs are kept in `train.programs` for the next run in this process
built from the same things, so a sweep, a retry or a test suite compiles each
once. Each program is kept under a key of everything it closes over, and of
nothing else, so that runs differing elsewhere share it:

  model variables (init, abstract params)   model, input shape
  train state (init, from other weights)   + optimizer and resolved schedule
  eval step                                 model, evaluation overrides, input
                                            shape, loss
  finiteness check                          the mesh
  train step, metric names, empty metrics   the whole config less what only
                                            drives the loop or picks the start

(`programs.run_key`; every key also holds the mesh, the process count and the
router and loss objects the config names.) The random keys are arguments of the
programs, not constants in them, so runs over seeds share every program.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen
import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding

from vmoe_sparse_ot import nn
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import compute
from vmoe_sparse_ot.train import losses as losses_lib
from vmoe_sparse_ot.train import mixup as mixup_lib
from vmoe_sparse_ot.train import optimizer as optimizer_lib
from vmoe_sparse_ot.train import periodic_eval
from vmoe_sparse_ot.train import programs
from vmoe_sparse_ot.train import run_record
from vmoe_sparse_ot.train import state as state_lib
from vmoe_sparse_ot.train.metrics import TrainMetrics
from vmoe_sparse_ot.train.state import TrainState
from vmoe_sparse_ot.train.step import make_step


@dataclasses.dataclass(frozen=True)
class Programs:
  """A run's jitted programs (each compiled on its first call, once per process).

  init_variables: key -> (params, model_state), the model's initial variables.
  init_state: (init key, root key) -> the step-0 TrainState, on its shardings.
  create_state: (params, model_state, root key) -> the step-0 TrainState of given
    parameters (another run's weights), on its shardings.
  train_step: (TrainState, batch, TrainMetrics) -> (TrainState, TrainMetrics),
    donating the state and the metrics.
  eval_step: (params, batch, model_state) -> sums (`periodic_eval.make_eval_step`)
    of `Run.eval_model`, replicated.
  all_finite: TrainState -> bool scalar, replicated.
  empty_metrics: batch -> a fresh TrainMetrics buffer of the train step's metric
    names (traced once from the first batch's shapes).
  flops_per_step: batch -> XLA's FLOP count of the train step on batches like
    it, per device (`train.compute`), None if XLA gives none; from the compiled
    program the step runs (lowered again, it is found compiled).
  """
  init_variables: Callable[[jax.Array], tuple[Any, Any]]
  init_state: Callable[[jax.Array, jax.Array], TrainState]
  create_state: Callable[[Any, Any, jax.Array], TrainState]
  train_step: Callable[..., tuple[TrainState, TrainMetrics]]
  eval_step: Callable[..., dict[str, Any]]
  all_finite: Callable[[TrainState], jax.Array]
  empty_metrics: Callable[[Any], TrainMetrics]
  flops_per_step: Callable[[Any], float | None]


@dataclasses.dataclass(frozen=True)
class Run:
  """Everything a training run is built from (see the module's docstring).

  batch_size, eval_batch_size: per process. init_key, root_key: the seed's keys,
  of the initial parameters and of the steps' randomness. record: the run record
  (`train.run_record.make`). compiles: whether the train step is new to this
  process (False: an earlier run built it).
  """
  config: ml_collections.ConfigDict
  model: flax.linen.Module
  eval_model: flax.linen.Module
  mesh: Mesh
  schedule: optax.Schedule
  tx: optax.GradientTransformation
  abstract_params: Any
  abstract_state: TrainState
  state_sharding: TrainState
  batch_sharding: NamedSharding
  replicated: NamedSharding
  batch_size: int
  eval_batch_size: int
  init_key: jax.Array
  root_key: jax.Array
  record: dict[str, Any]
  compiles: bool
  programs: Programs


# What each kind of program is built from (dotted config paths; `programs.run_key`).
VARIABLES_FROM = ('model', 'dataset.image_size', 'dataset.channels')
STATE_FROM = VARIABLES_FROM + ('optimizer', 'schedule')
EVAL_FROM = ('model', 'loss', 'evaluate.model_overrides', 'dataset.image_size')


def tokens_per_image(model: flax.linen.Module, image_size: int) -> int | None:
  """N, the tokens of one image in the encoder (None for a dense model)."""
  if not model.moe_layers:
    return None
  ph, pw = model.patch_size
  return (image_size // ph) * (image_size // pw) + int(model.classifier == 'token')


def _per_process(global_size: int, what: str, num_devices: int) -> int:
  if global_size % jax.process_count() or global_size % num_devices:
    raise ValueError(f'config.{what}={global_size} must be a multiple of the number of '
                     f'devices ({num_devices}) and of processes ({jax.process_count()})')
  return global_size // jax.process_count()


def build(config: ml_collections.ConfigDict, model: flax.linen.Module,
          devices: list[Any] | None = None) -> Run:
  """The run of a validated `config` whose model is `model` (`nn.build_model`), on
  `devices` (default: all). Raises ValueError naming a batch size the devices and
  processes do not divide."""
  num_experts = config.model.encoder.moe.num_experts if config.model.name == 'vit_moe' else 1
  mesh = parallel.make_mesh(config.mesh, devices, num_experts)
  batch_size = _per_process(config.batch_size, 'batch_size', mesh.size)
  eval_batch_size = _per_process(config.eval_batch_size, 'eval_batch_size', mesh.size)
  parts = (type(model), nn.routers.ROUTERS.get(config.model.encoder.moe.router.name))
  loss_fn = losses_lib.get(config.loss.name)
  keys = {'variables': programs.run_key(config, mesh, parts, only=VARIABLES_FROM),
          'state': programs.run_key(config, mesh, parts, only=STATE_FROM),
          'eval': programs.run_key(config, mesh, parts + (loss_fn,), only=EVAL_FROM),
          'mesh': programs.run_key(config, mesh, only=()),
          'run': programs.run_key(config, mesh, parts + (loss_fn,))}
  init_key, root_key = jax.random.split(jax.random.key(config.seed))

  init_variables = programs.get(keys['variables'], 'init_variables',
                                lambda: _init_variables(model, config.dataset))
  abstract_params = programs.get(keys['variables'], 'abstract_params', lambda: jax.eval_shape(
      lambda key: init_variables(key)[0], init_key))
  schedule = optimizer_lib.make_schedule(config.schedule, int(config.train_steps))
  tx = optimizer_lib.make_optimizer(config.optimizer, schedule, abstract_params)
  _log_frozen(abstract_params, config.optimizer)
  abstract_state = programs.get(keys['state'], 'abstract_state', lambda: jax.eval_shape(
      lambda key, root: _create(init_variables(key), tx, root), init_key, root_key))
  state_sharding = state_lib.shardings_on_mesh(mesh, tx, abstract_state)
  replicated = parallel.replicated(mesh)
  batch_sharding = parallel.batch_sharding(mesh)
  evaluated = periodic_eval.eval_model(config, model)
  compiles = not programs.has(keys['run'], 'train_step')
  step_fn = _step_fn(config, model, tx)
  train_step = programs.get(keys['run'], 'train_step', lambda: jax.jit(
      with_metrics(step_fn), in_shardings=(state_sharding, batch_sharding, replicated),
      out_shardings=(state_sharding, replicated), donate_argnums=(0, 2)))
  empty_metrics = _empty_metrics(keys['run'], step_fn, abstract_state, replicated,
                                 int(config.log_every_steps))
  run_programs = Programs(
      init_variables=init_variables,
      init_state=programs.get(keys['state'], 'init_state', lambda: jax.jit(
          lambda key, root: _create(init_variables(key), tx, root),
          out_shardings=state_sharding)),
      create_state=programs.get(keys['state'], 'create_state', lambda: jax.jit(
          lambda p, m, root: state_lib.create(p, tx, root, m), out_shardings=state_sharding)),
      train_step=train_step,
      eval_step=programs.get(keys['eval'], 'eval_step', lambda: jax.jit(
          periodic_eval.make_eval_step(
              evaluated, config.loss.name,
              num_tokens=tokens_per_image(evaluated, int(config.dataset.image_size))),
          in_shardings=(state_sharding.params, batch_sharding, state_sharding.model_state),
          out_shardings=replicated)),
      all_finite=programs.get(keys['mesh'], 'all_finite', lambda: jax.jit(
          state_lib.all_finite, out_shardings=replicated)),
      empty_metrics=empty_metrics,
      flops_per_step=lambda batch: programs.get(keys['run'], 'flops_per_step', lambda: (
          compute.compiled_flops(train_step.lower(
              with_shardings(abstract_state, state_sharding), batch,
              empty_metrics(batch)).compile()))))
  return Run(config=config, model=model, eval_model=evaluated, mesh=mesh, schedule=schedule,
             tx=tx, abstract_params=abstract_params, abstract_state=abstract_state,
             state_sharding=state_sharding, batch_sharding=batch_sharding,
             replicated=replicated, batch_size=batch_size, eval_batch_size=eval_batch_size,
             init_key=init_key, root_key=root_key,
             record=run_record.make(config, abstract_params), compiles=compiles,
             programs=run_programs)


def with_shardings(abstract_state: TrainState, state_sharding: TrainState) -> TrainState:
  """The abstract TrainState carrying its shardings: what Orbax restores into and
  what the train step is lowered on."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract_state, state_sharding)


def accounting(run: Run, batch: Any) -> compute.StepAccounting:
  """The compute columns of the run's train rows (`train.compute`); `batch` is the
  first training batch (its shapes are every step's)."""
  return compute.StepAccounting(
      lambda: run.programs.flops_per_step(batch), run.mesh.size,
      compute.peak_flops_per_device(run.config.get('peak_flops_per_device'),
                                    run.mesh.devices.flat[0]),
      images_per_step=int(run.config.batch_size))


def _init_variables(model: flax.linen.Module, dataset: Any) -> Callable:
  """key -> (params, model_state) of `model` on one image of `config.dataset`'s shape.

  Jitted: the abstract shapes and the initializing programs share one trace of
  the model's init, and eagerly model.init would compile each of its ops alone.
  """
  image_shape = (1, dataset.image_size, dataset.image_size, dataset.channels)

  @jax.jit
  def init_variables(key):  # (params, model_state), see nn.router_state
    params_key, gating_key, dropout_key = jax.random.split(key, 3)
    return nn.router_state.split(model.init(
        {'params': params_key, 'gating': gating_key, 'dropout': dropout_key},
        jnp.zeros(image_shape), train=False))

  return init_variables


def _empty_metrics(key: Any, step_fn: Callable, abstract_state: TrainState,
                   replicated: NamedSharding, log_every_steps: int) -> Callable:
  """batch -> a fresh TrainMetrics buffer (replicated) for the metrics `step_fn`
  returns on batches of that structure and shapes (one run's are all alike)."""

  def empty_metrics(batch):
    names = programs.get(key, 'metric_names', lambda: sorted(
        jax.eval_shape(step_fn, abstract_state, batch)[1]))
    return programs.get(key, 'empty_metrics', lambda: jax.jit(
        lambda: TrainMetrics.empty(names, log_every_steps), out_shardings=replicated))()

  return empty_metrics


def _create(variables: tuple[Any, Any], tx: optax.GradientTransformation,
            root_key: jax.Array) -> TrainState:
  params, model_state = variables
  return state_lib.create(params, tx, root_key, model_state)


def _step_fn(config: ml_collections.ConfigDict, model: flax.linen.Module,
             tx: optax.GradientTransformation) -> Callable:
  # Jitted, so that the metric names' shapes and the train step share one trace
  # of it (nested in the train step, XLA inlines it).
  return jax.jit(make_step(model, tx, float(config.label_smoothing), int(config.microsteps),
                           config.loss.name, mixup_lib.Mixup.from_config(config.mixup)))


def with_metrics(step_fn: Callable) -> Callable:
  """The train step of a `make_step` function: its values merged into the metrics."""

  def train_step(state: TrainState, batch, metrics: TrainMetrics):
    new_state, values = step_fn(state, batch)
    return new_state, metrics.update(values, new_state.step)

  return train_step


def _log_frozen(abstract_params: Any, optimizer_config: Any) -> None:
  frozen = optimizer_lib.frozen_names(abstract_params, optimizer_config.freeze,
                                      optimizer_config.param_naming)
  if frozen:
    logging.info('optimizer.freeze keeps %d parameter arrays fixed: %s', len(frozen),
                 ', '.join(frozen[:6]) + (', ...' if len(frozen) > 6 else ''))
