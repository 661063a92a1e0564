"""Gradient accumulation: one optimizer update from M smaller forward/backward passes.

`config.microsteps = M` splits each global batch of B examples into M
microbatches of B / M and sums their gradients in a `lax.scan`, so activation
memory is that of B / M examples while the update is the large batch's: the
loss is a mean over examples, so the mean of the M microbatch gradients is the
full-batch gradient (exactly, up to float summation order, for a model without
batch statistics; MoE routing groups are formed within a microbatch, as they
would be on a device holding B / M examples).

A stateful router (`nn.router_state`, e.g. topk_bias) is updated once per
optimizer step, not per microbatch: every microbatch routes with the state of
the step's start, and the update reads the statistics summed over the M
microbatches (its token counts are then those of the whole batch).

Microbatch j takes examples j, j + M, j + 2M, ... (a strided split): a device
that holds a contiguous block of the global batch holds the same share of every
microbatch, so no example moves between devices.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn.sharding import constrain

BATCH_AXES = ('data', 'expert')

# (params, batch, key) -> (gradients like params, {metric name: scalar}, totals):
# gradients and metrics are averaged over the microbatches, totals (e.g. the
# router's token counts, `nn.router_state`) summed.
GradFn = Callable[[Any, Any, jax.Array], tuple[Any, dict[str, jax.Array], Any]]


def split(batch: Any, microsteps: int) -> Any:
  """Leaves (B, ...) -> (M, B / M, ...); microbatch j holds examples j, j + M, ..."""
  def one(x):
    if x.shape[0] % microsteps:
      raise ValueError(f'microsteps={microsteps} must divide the per-step batch '
                       f'({x.shape[0]} examples)')
    x = x.reshape(x.shape[0] // microsteps, microsteps, *x.shape[1:]).swapaxes(0, 1)
    return constrain(x, (None, BATCH_AXES))
  return jax.tree.map(one, batch)


def accumulate(grad_fn: GradFn, params: Any, batch: Any, key: jax.Array,
               microsteps: int) -> tuple[Any, dict[str, jax.Array], Any]:
  """Mean gradients, mean metrics and summed totals of `grad_fn` over `microsteps`
  microbatches.

  Microbatch j draws its randomness from `fold_in(key, j)`. With one microstep
  this is `grad_fn(params, batch, key)` itself (the same program and keys as a
  run without accumulation).
  """
  if microsteps == 1:
    return grad_fn(params, batch, key)
  micro = split(batch, microsteps)

  def body(totals, j):
    microbatch = jax.tree.map(lambda x: x[j], micro)
    out = grad_fn(params, microbatch, jax.random.fold_in(key, j))
    return jax.tree.map(jnp.add, totals, out), None

  first = jax.tree.map(lambda x: x[0], micro)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                       jax.eval_shape(grad_fn, params, first, key))
  (grads, metrics, sums), _ = jax.lax.scan(body, zeros, jnp.arange(microsteps))
  mean = lambda x: x / microsteps
  return jax.tree.map(mean, grads), jax.tree.map(mean, metrics), sums
