"""Python API: a trained checkpoint as a function of images, numpy in and numpy out.

    import vmoe_sparse_ot
    m = vmoe_sparse_ot.load('workdirs/tiny')                       # latest step
    m = vmoe_sparse_ot.load('workdirs/tiny', step=300, router='sparse_ot',
                            capacity_factor=0.5, batch_priority=True)
    logits = m.predict(images)         # (B, num_classes) float32
    feats = m.features(images)         # (B, D') float32, the pre_logits representation
    routes = m.routing(images)         # {layer: {'experts': (B, N, K) int32,
                                       #          'weights': (B, N, K) float32}}

`images` are what the model sees after eval preprocessing: float32 (B, H, W, C)
in [-1, 1] (`data.make_dataset(..., training=False)` yields them), with (H, W, C)
`m.image_shape`. The model is the checkpoint's (its metadata's model config),
with the routing overrides of `evaluate.overrides` (the same as the command line
`python -m vmoe_sparse_ot.evaluate`): `router`, `num_selected_experts`,
`capacity_factor`, `capacity`, `batch_priority`.

Images go through the model `batch_size` at a time; the last batch is padded with
zero images (as the eval pipeline pads), so one compiled function serves every
call. Routing is per group of S tokens, and the tokens of a group compete for
buffer slots, so an image's routing (and with it its logits) can depend on the
images batched with it: the same images in the same batches as the eval job give
the same results. Parameters live on the first local device, and everything
runs there (one device).

`routing` per MoE layer (e.g. 'encoderblock_1'): for every image b and token n
(N tokens in the encoder's order: the class token first for `classifier='token'`,
then the patches row by row), its experts in decreasing combine weight and those
weights, K = E columns; -1 and weight 0 after its last expert. A token with
`experts[b, n, 0] == -1` was dropped. The weights of a token sum to its total
combine weight, read from the `expert_weights` (G, S, E) the MoE layer sows.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.evaluate import overrides as overrides_lib
from vmoe_sparse_ot.nn import routing_stats
from vmoe_sparse_ot import checkpoints

DEFAULT_BATCH_SIZE = 64


class LoadedModel:
  """A restored checkpoint; see the module docstring. Build it with `load`."""

  def __init__(self, model, params: Any, model_config: dict[str, Any], *, step: int,
               meta: dict[str, Any], overrides: dict[str, Any], batch_size: int,
               model_state: dict[str, Any] | None = None):
    self.model = model
    self.params = params
    self.model_state = model_state or {}   # router state (nn.router_state), e.g. a bias
    self.model_config = model_config
    self.step = step
    self.meta = meta
    self.overrides = overrides
    self.batch_size = batch_size
    shapes = checkpoints.param_shapes(params)
    self.image_shape = overrides_lib.image_shape(shapes, model_config['classifier'])
    self.num_tokens = int(shapes['encoder/pos_embedding'][1])
    self.capacity = overrides_lib.capacity(model_config)
    self._forward = jax.jit(self._outputs)

  def _outputs(self, params, model_state, images):
    (logits, aux), state = self.model.apply({'params': params, **model_state}, images,
                                            train=False, mutable=['intermediates'])
    routes = {}
    for layer, w in routing_stats.layer_weights(state).items():
      experts, weights = routing_stats.assignments(
          routing_stats.per_image(w, images.shape[0], self.num_tokens))
      routes[layer] = {'experts': experts, 'weights': weights}
    return {'logits': logits, 'pre_logits': aux['pre_logits'], 'routing': routes}

  def outputs(self, images: np.ndarray) -> dict[str, Any]:
    """{'logits' (B, classes), 'pre_logits' (B, D'), 'routing' {layer: {...}}} in one pass."""
    images = self._check(images)
    b, size = images.shape[0], self.batch_size
    device = jax.local_devices()[0]
    pending = []
    for start in range(0, max(b, 1), size):
      chunk = images[start:start + size]
      if chunk.shape[0] < size:  # One batch shape: the last batch is padded, not recompiled.
        chunk = np.concatenate([chunk, np.zeros((size - chunk.shape[0],) + chunk.shape[1:],
                                                np.float32)])
      pending.append(self._forward(self.params, self.model_state,
                                   jax.device_put(chunk, device)))
    fetched = jax.device_get(pending)  # Every batch dispatched before the first fetch.
    return jax.tree.map(lambda *parts: np.concatenate(parts)[:b], *fetched)

  def predict(self, images: np.ndarray) -> np.ndarray:
    """Logits (B, num_classes) float32."""
    return self.outputs(images)['logits']

  def features(self, images: np.ndarray) -> np.ndarray:
    """The pre_logits representation (B, D') float32 (what few-shot evaluation uses)."""
    return self.outputs(images)['pre_logits']

  def routing(self, images: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """{MoE layer: {'experts': (B, N, K) int32, 'weights': (B, N, K) float32}}, K = E."""
    return self.outputs(images)['routing']

  def _check(self, images: Any) -> np.ndarray:
    images = np.asarray(images, np.float32)
    if images.ndim != 4 or tuple(images.shape[1:]) != tuple(self.image_shape):
      raise ValueError(f'images must be float32 (B, {", ".join(map(str, self.image_shape))}) '
                       f'(B, H, W, C, after eval preprocessing), got shape {images.shape}')
    return images

  def __repr__(self) -> str:
    changed = overrides_lib.describe(self.overrides)
    model = self.model_config['name']
    router = (self.model_config['encoder']['moe']['router']['name'] if model == 'vit_moe'
              else None)
    return (f'LoadedModel({model}, router {router}, step {self.step}'
            f'{", " + changed if changed else ""}, batch_size {self.batch_size})')


def load(workdir: str, step: int | None = None, *, batch_size: int = DEFAULT_BATCH_SIZE,
         **overrides: Any) -> LoadedModel:
  """Restores checkpoint `step` (default: the newest that restores) of `workdir`.

  Args:
    workdir: a training workdir (holding checkpoints/).
    step: the checkpoint step; None for the latest.
    batch_size: images per compiled call.
    **overrides: routing overrides `router`, `num_selected_experts`, `capacity_factor`,
      `capacity`, `batch_priority` (`evaluate.overrides.apply_routing_overrides`).

  Raises:
    ValueError: an unknown override (named), a bad value, routing that does not fit
      the checkpoint, or batch_size < 1.
    FileNotFoundError: no checkpoint (for `step`) in `workdir`.
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f'batch_size={batch_size!r}: must be an integer >= 1')
  overrides = overrides_lib.normalize_routing_overrides(overrides)  # Before reading anything.
  params, meta, found = checkpoints.restore_params_with_meta(workdir, step)
  saved = meta.get('model_config')
  if saved is None:
    raise ValueError(f'checkpoint step {found} of {workdir} records no model config')
  model_config = overrides_lib.apply_routing_overrides(saved, **overrides)
  model = nn.build_model(model_config)
  shapes = checkpoints.param_shapes(params)
  image_shape = overrides_lib.image_shape(shapes, model_config['classifier'])
  overrides_lib.check_param_shapes(model, shapes, overrides, image_shape)
  # The router state the run routes with (topk_bias's bias; fresh under a router override).
  model_state = nn.router_state.for_model(model, image_shape,
                                          checkpoints.restore_model_state(workdir, found))
  return LoadedModel(model, params, model_config, step=int(found), meta=meta,
                     overrides=overrides, batch_size=batch_size, model_state=model_state)
