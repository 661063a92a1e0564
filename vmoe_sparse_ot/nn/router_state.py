"""Router state in a model: the Flax collections a stateful router uses, and its update.

A router with a `RouterState` (`nn.routers.base`) keeps, in each MoE layer,
- its state in the collection 'router_state' (`STATE`): variables
  `router_state/<layer path>/<name>`, created by `model.init` from
  `RouterState.init`, read by every apply (training and evaluation alike);
- the statistics of a training forward pass in 'router_stats' (`STATISTICS`),
  written only when the caller makes that collection mutable.

The model's state is the dict of its state collections, {'router_state': tree}
(`{}` for a model without stateful routers), alongside the params:

  variables = model.init(...); params, model_state = split(variables)
  (logits, aux), out = model.apply(with_state(params, model_state), x, train=True,
                                   mutable=[STATISTICS])
  model_state = update(router_config(model), model_state, out[STATISTICS])

The trainer keeps `model_state` in its TrainState (replicated, checkpointed) and
calls `update` once per optimizer step with the statistics summed over the
step's microbatches; evaluation passes the current state and never updates it.
Readers of a checkpoint take its saved state through `for_model`.
"""
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
from flax import traverse_util

from vmoe_sparse_ot.nn import routers

STATE = "router_state"
STATISTICS = "router_stats"
STATE_COLLECTIONS = (STATE,)


def split(variables: Mapping[str, Any]) -> Tuple[Any, Dict[str, Any]]:
  """(params, model state {collection: tree}) of `model.init`'s variables."""
  return variables["params"], {c: variables[c] for c in STATE_COLLECTIONS if c in variables}


def with_state(params: Any, model_state: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
  """The variables dict `model.apply` takes: {'params': params, **model_state}."""
  return {"params": params, **(model_state or {})}


def router_config(model) -> Optional[routers.RouterConfig]:
  """The RouterConfig of a `VisionTransformer`'s MoE layers (None without MoE layers)."""
  moe = getattr(model, "moe", None)
  return moe["router"] if moe else None


def update(cfg: Optional[routers.RouterConfig], model_state: Mapping[str, Any],
           statistics: Mapping[str, Any]) -> Dict[str, Any]:
  """The model state after one optimizer step: each layer's `RouterState.update`.

  `statistics` is the 'router_stats' tree (summed over the step's microbatches);
  a layer without statistics keeps its state. A model without state returns it as is.
  """
  model_state = dict(model_state)
  if STATE not in model_state or cfg is None:
    return model_state
  spec = routers.get_router(cfg.name).state
  state = traverse_util.flatten_dict(model_state[STATE])
  stats = traverse_util.flatten_dict(dict(statistics or {}))
  layers = sorted({path[:-1] for path in state})
  new = {}
  for layer in layers:
    old = {p[-1]: v for p, v in state.items() if p[:-1] == layer}
    got = {p[-1]: v for p, v in stats.items() if p[:-1] == layer}
    updated = spec.update(cfg.options, old, got) if got else old
    new.update({layer + (name,): value for name, value in updated.items()})
  model_state[STATE] = traverse_util.unflatten_dict(new)
  return model_state


def for_model(model, image_shape: Sequence[int], saved: Optional[Mapping[str, Any]]
              ) -> Dict[str, Any]:
  """The model state to evaluate `model` on images (H, W, C) with: `saved` (a
  checkpoint's) when it is this model's state tree, else the state at step 0
  (`RouterState.init`; a run without router state, or a router override).
  {} for a model without state."""
  def fresh():
    image = jnp.zeros((1, *image_shape), jnp.float32)
    return split(model.init({"params": jax.random.key(0)}, image, train=False))[1]

  want = jax.eval_shape(fresh)
  if not want:
    return {}
  saved = dict(saved or {})
  if jax.tree.structure(saved) == jax.tree.structure(want) and all(
      a.shape == b.shape and a.dtype == b.dtype
      for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(want))):
    return saved
  return jax.jit(fresh)()
