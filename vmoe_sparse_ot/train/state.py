"""TrainState: everything a training step reads and writes, as one pytree.

Init, restore, the train step, the sharding tree and checkpoints all carry this
one object, so adding training state means adding a field here (and, if it is
not replicated, its sharding in `shardings`).
"""
from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.train import partitioning


@flax.struct.dataclass
class TrainState:
  """params, opt_state, rng and step of a run.

  rng: the run's root key as raw uint32 key data (shape (2,)), so that Orbax
    stores it like any array; step t draws its keys from `fold_in(rng, t)`.
  step: int32 scalar, the number of optimizer steps taken.
  """
  params: Any
  opt_state: Any
  rng: jax.Array
  step: jax.Array

  @property
  def key(self) -> jax.Array:
    return jax.random.wrap_key_data(self.rng)


def create(params: Any, tx: optax.GradientTransformation, root_key: jax.Array) -> TrainState:
  """Step-0 state: fresh optimizer state; `root_key` is a typed key."""
  return TrainState(params=params, opt_state=tx.init(params),
                    rng=jax.random.key_data(root_key), step=jnp.zeros((), jnp.int32))


def shardings(params_sharding: Any, opt_state_sharding: Any, mesh) -> TrainState:
  """The TrainState of shardings: rng and step replicated over the mesh."""
  replicated = NamedSharding(mesh, P())
  return TrainState(params=params_sharding, opt_state=opt_state_sharding, rng=replicated,
                    step=replicated)


def shardings_on_mesh(mesh, tx: optax.GradientTransformation,
                      abstract_state: TrainState) -> TrainState:
  """The TrainState of shardings a run uses: expert parameters (leading E axis) and
  their optimizer statistics split over 'expert', everything else replicated."""
  params_sharding = partitioning.param_shardings(
      mesh, abstract_state.params, [(nn.EXPERT_PARAMS_REGEX, P('expert'))])
  return shardings(
      params_sharding,
      partitioning.opt_state_shardings(tx, abstract_state.opt_state, params_sharding, mesh),
      mesh)


def with_shardings(abstract: TrainState, sharding_tree: TrainState) -> TrainState:
  """ShapeDtypeStructs carrying their shardings, the form Orbax restores into."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, sharding_tree)


def all_finite(tree: Any) -> jax.Array:
  """True when every floating-point leaf of `tree` is finite (a bool scalar)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)
