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
from vmoe_sparse_ot import parallel


@flax.struct.dataclass
class TrainState:
  """params, opt_state, rng, step and model_state of a run.

  model_state: the model's state outside the gradient, {collection: tree}
    (`nn.router_state`: {'router_state': per-layer router state} for a stateful
    router such as 'topk_bias', {} otherwise); updated once per step by the
    train step, replicated over the mesh, checkpointed with the rest.
  rng: the run's root key as raw uint32 key data (shape (2,)), so that Orbax
    stores it like any array; step t draws its keys from `fold_in(rng, t)`.
  step: int32 scalar, the number of optimizer steps taken.
  """
  params: Any
  opt_state: Any
  rng: jax.Array
  step: jax.Array
  model_state: Any = flax.struct.field(default_factory=dict)

  @property
  def key(self) -> jax.Array:
    return jax.random.wrap_key_data(self.rng)


def create(params: Any, tx: optax.GradientTransformation, root_key: jax.Array,
           model_state: Any = None) -> TrainState:
  """Step-0 state: fresh optimizer state; `root_key` is a typed key; `model_state`
  as `model.init` made it (None: {})."""
  return TrainState(params=params, opt_state=tx.init(params),
                    rng=jax.random.key_data(root_key), step=jnp.zeros((), jnp.int32),
                    model_state=model_state or {})


def shardings(params_sharding: Any, opt_state_sharding: Any, mesh,
              model_state: Any = None) -> TrainState:
  """The TrainState of shardings: rng, step and `model_state` (a tree like the
  state's, e.g. abstract) replicated over the mesh.

  The router state is tiny (topk_bias: E floats per MoE layer) and every device
  routes with all of it, so it is replicated rather than split over 'expert'.
  """
  replicated = NamedSharding(mesh, P())
  return TrainState(params=params_sharding, opt_state=opt_state_sharding, rng=replicated,
                    step=replicated,
                    model_state=jax.tree.map(lambda _: replicated, model_state or {}))


def shardings_on_mesh(mesh, tx: optax.GradientTransformation,
                      abstract_state: TrainState) -> TrainState:
  """The TrainState of shardings a run uses: expert parameters (leading E axis) and
  their optimizer statistics split over 'expert', everything else replicated."""
  params_sharding = parallel.param_shardings(
      mesh, abstract_state.params, [(nn.EXPERT_PARAMS_REGEX, P('expert'))])
  return shardings(
      params_sharding,
      parallel.opt_state_shardings(tx, abstract_state.opt_state, params_sharding, mesh),
      mesh, abstract_state.model_state)


def with_shardings(abstract: TrainState, sharding_tree: TrainState) -> TrainState:
  """ShapeDtypeStructs carrying their shardings, the form Orbax restores into."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                      abstract, sharding_tree)


def all_finite(tree: Any) -> jax.Array:
  """True when every floating-point leaf of `tree` is finite (a bool scalar)."""
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)
