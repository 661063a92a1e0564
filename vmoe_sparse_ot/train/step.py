"""The train step as a pure function: `make_step(model, tx, ...)` gives
`(TrainState, batch) -> (TrainState one step later, {metric name: scalar})`.

Its own module so that what only needs the step (benchmarks that compile it,
tests, the trainer's loop) imports no input pipeline, checkpointing or logging:
this file depends on JAX, optax and the model code alone.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from vmoe_sparse_ot import nn
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import losses as losses_lib
from vmoe_sparse_ot.train import microsteps as microsteps_lib
from vmoe_sparse_ot.train import mixup as mixup_lib
from vmoe_sparse_ot.train.state import TrainState


def _flatten_routing(routing: dict[str, dict[str, Any]]) -> dict[str, Any]:
  return {f'routing/{layer}/{name}': value
          for layer, metrics in routing.items() for name, value in metrics.items()}


def make_step(model, tx: optax.GradientTransformation, label_smoothing: float = 0.0,
              microsteps: int = 1, loss: str = 'softmax_xent',
              mixup: mixup_lib.Mixup = mixup_lib.Mixup()):
  """(TrainState, batch) -> (TrainState one step later, {metric name: scalar}).

  `loss` names a `train.losses` loss ('cross_entropy' is its value); with
  `mixup.p` > 0 the batch is mixed first (`train.mixup`, a key split off the
  step's; 'device' and 'example' granularity mix within the batch's shards over
  the mesh the step is traced under). With `microsteps` > 1 the gradient is accumulated over that many
  microbatches (`vmoe_sparse_ot.train.microsteps`); the metrics are their means.
  A stateful router's state (`state.model_state`, `nn.router_state`) is updated
  once per step from its statistics summed over the microbatches.
  """
  loss_per_example = losses_lib.get(loss)
  router_cfg = nn.router_state.router_config(model)
  members, loss_name = nn.ensemble_size(model), loss

  def grads_and_values(params, model_state, batch, key):
    dropout_key, gating_key = jax.random.split(key)

    def loss_fn(params):
      (logits, aux), out = model.apply(
          nn.router_state.with_state(params, model_state), batch['image'], train=True,
          rngs={'dropout': dropout_key, 'gating': gating_key},
          mutable=[nn.router_state.STATISTICS])
      # E³: each member against the targets (the reference's ensemble training loss).
      targets = batch if members == 1 else losses_lib.repeat_targets(batch, members)
      ce = loss_per_example(logits, targets, label_smoothing).mean()
      return ce + aux['auxiliary_loss'], (ce, logits, aux, out)

    (loss, (ce, logits, aux, out)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    if members > 1:  # The ensemble's top-1: of the members' mean probability.
      logits = losses_lib.ensemble_log_probs(logits, members, loss_name)
    values = {
        'loss': loss, 'cross_entropy': ce, 'auxiliary_loss': aux['auxiliary_loss'],
        'accuracy': jnp.mean(losses_lib.top1_correct(logits, batch)),
        **_flatten_routing(aux.get('routing', {})),
    }
    return grads, values, dict(out.get(nn.router_state.STATISTICS, {}))

  def step_fn(state: TrainState, batch):
    step = state.step + 1
    key = jax.random.fold_in(state.key, step)
    if mixup.p:
      mixup_key, key = jax.random.split(key)
      batch = mixup_lib.mixup(mixup_key, batch, mixup.p, granularity=mixup.granularity,
                              size=mixup.size, num_shards=mixup_lib.mesh_shards(parallel.AXES))
    grads, values, statistics = microsteps_lib.accumulate(
        lambda p, b, k: grads_and_values(p, state.model_state, b, k), state.params, batch,
        key, microsteps)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    values['grad_norm'] = optax.tree.norm(grads)
    # Router state (e.g. topk_bias's bias): once per optimizer step, from the
    # statistics summed over the microbatches, outside the gradient.
    model_state = nn.router_state.update(router_cfg, state.model_state, statistics)
    new_state = state.replace(params=optax.apply_updates(state.params, updates),
                              opt_state=opt_state, step=step, model_state=model_state)
    return new_state, values

  return step_fn
