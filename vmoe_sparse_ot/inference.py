"""Python API: a trained checkpoint as a function of images, numpy in and numpy out.

    import vmoe_sparse_ot
    m = vmoe_sparse_ot.load('workdirs/tiny')                       # latest step
    m = vmoe_sparse_ot.load('workdirs/tiny', step=300, router='sparse_ot',
                            capacity_factor=0.5, batch_priority=True)
    m = vmoe_sparse_ot.load(checkpoint='gs://bucket/vmoe_prefix',   # no workdir: a released
                            config='configs/vmoe_b16.py')           # checkpoint, its model
    logits = m.predict(images)         # (B, num_classes) float32
    feats = m.features(images)         # (B, D') float32, the pre_logits representation
    routes = m.routing(images)         # {layer: {'experts': (B, N, K) int32,
                                       #          'weights': (B, N, K) float32}}

An E³ model (`model.ensemble_size` M > 1) is combined as its evaluation combines
it: `predict` gives log((1/M) sum_m softmax(z_m)), the log of the members' mean
probability (the softmax of it is that mean; a model trained with sigmoid_xent
combines per-class sigmoids instead: use `train.losses.ensemble_log_probs` on
`outputs(images)['member_logits']`, (B, M, classes)); `features` the mean of the
members' pre-logits (what few-shot evaluation uses); `routing` holds
(B, M, N, K) arrays, member m's routing of each image.

`images` are what the model sees after eval preprocessing: float32 (B, H, W, C)
in [-1, 1] (`data.make_dataset(..., training=False)` yields them), with (H, W, C)
`m.image_shape`. The model is the checkpoint's (its metadata's model config;
for `checkpoint=` the config's `model`, the weights read by
`evaluate.released.read_weights`, which must be exactly that model's),
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

import json
from typing import Any

import jax
import numpy as np

from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.evaluate import overrides as overrides_lib
from vmoe_sparse_ot.evaluate import released
from vmoe_sparse_ot.nn import routing_stats
from vmoe_sparse_ot.train import losses
from vmoe_sparse_ot import checkpoints

DEFAULT_BATCH_SIZE = 64


class LoadedModel:
  """A restored checkpoint; see the module docstring. Build it with `load`."""

  def __init__(self, model, params: Any, model_config: dict[str, Any], *, step: int | None,
               meta: dict[str, Any], overrides: dict[str, Any], batch_size: int,
               model_state: dict[str, Any] | None = None,
               image_shape: tuple[int, int, int] | None = None):
    self.model = model
    self.params = params
    self.model_state = model_state or {}   # router state (nn.router_state), e.g. a bias
    self.model_config = model_config
    self.step = step
    self.meta = meta
    self.overrides = overrides
    self.batch_size = batch_size
    shapes = checkpoints.param_shapes(params)
    # Given where the parameters do not tell it (no position-embedding parameter).
    self.image_shape = image_shape or overrides_lib.image_shape(shapes,
                                                                model_config['classifier'])
    self.num_tokens = overrides_lib.num_tokens(shapes, self.image_shape,
                                               model_config['classifier'])
    self.capacity = overrides_lib.capacity(model_config)
    self.ensemble_size = nn.ensemble_size(model)   # E³ members M; 1 for a V-MoE
    self._forward = jax.jit(self._outputs)

  def _outputs(self, params, model_state, images):
    (logits, aux), state = self.model.apply({'params': params, **model_state}, images,
                                            train=False, mutable=['intermediates'])
    b, members = images.shape[0], self.ensemble_size
    routes = {}
    for layer, w in routing_stats.layer_weights(state).items():
      experts, weights = routing_stats.assignments(
          routing_stats.per_image(w, b * members, self.num_tokens))
      if members > 1:  # (B, M, N, K): each member's routing of each image.
        experts, weights = (x.reshape(b, members, *x.shape[1:]) for x in (experts, weights))
      routes[layer] = {'experts': experts, 'weights': weights}
    pre_logits = aux['pre_logits']
    if members == 1:
      return {'logits': logits, 'pre_logits': pre_logits, 'routing': routes}
    # E³: the members' mean softmax probability (in log space), the mean pre-logits.
    member_logits = logits.reshape(b, members, -1)
    pre_logits = pre_logits.reshape(b, members, -1).mean(axis=1)
    logits = (losses.ensemble_log_probs(logits, members) if self.model.num_classes
              else pre_logits)
    return {'logits': logits, 'pre_logits': pre_logits, 'member_logits': member_logits,
            'routing': routes}

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
    """Logits (B, num_classes) float32 (an E³ model: log of the members' mean softmax
    probability; `outputs(images)['member_logits']` holds each member's)."""
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


def load(workdir: str | None = None, step: int | None = None, *,
         checkpoint: str | None = None, config: Any = None,
         batch_size: int = DEFAULT_BATCH_SIZE, **overrides: Any) -> LoadedModel:
  """Restores checkpoint `step` (default: the newest that restores) of `workdir`, or
  the weights at `checkpoint` on the model of `config`.

  Args:
    workdir: a training workdir (holding checkpoints/).
    step: the checkpoint step; None for the latest (workdir only).
    checkpoint: instead of `workdir`, a checkpoint without a workdir: the reference
      V-MoE code's partitioned prefix (PREFIX.index + PREFIX.data-*) or a .npz,
      local or remote (`gs://...`). Needs `config`.
    config: with `checkpoint`, the config whose `model` the weights are: a
      ConfigDict or dict, or a config file 'path.py[:arg]' (local or remote); its
      dataset.image_size is the image size of a model with no position-embedding
      parameter ('sincos2d' or 'none').
    batch_size: images per compiled call.
    **overrides: routing overrides `router`, `num_selected_experts`, `capacity_factor`,
      `capacity`, `batch_priority` (`evaluate.overrides.apply_routing_overrides`).

  Raises:
    ValueError: an unknown override (named), a bad value, routing that does not fit
      the checkpoint, batch_size < 1, a bad combination of arguments, or a
      `checkpoint` that is unreadable or not exactly the config's model (one line).
    FileNotFoundError: no checkpoint (for `step`) in `workdir`, or no config file.
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
    raise ValueError(f'batch_size={batch_size!r}: must be an integer >= 1')
  if (workdir is None) == (checkpoint is None):
    raise ValueError('load: give a workdir or checkpoint=..., config=... (exactly one of '
                     'workdir and checkpoint)')
  if checkpoint is None and config is not None:
    raise ValueError('config= applies to checkpoint= only (a workdir holds its model config)')
  if checkpoint is not None and config is None:
    raise ValueError(f'checkpoint={checkpoint!r}: needs config= (the model comes from it)')
  if checkpoint is not None and step is not None:
    raise ValueError(f'step={step}: applies to a workdir only')
  overrides = overrides_lib.normalize_routing_overrides(overrides)  # Before reading anything.
  if checkpoint is not None:
    return _load_checkpoint(checkpoint, config, batch_size, overrides)
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


def _load_checkpoint(checkpoint: str, config: Any, batch_size: int,
                     overrides: dict[str, Any]) -> LoadedModel:
  """`load(checkpoint=..., config=...)`: step None, meta {'checkpoint', 'model_config',
  'param_shapes'}; the router state at step 0 (a reference run has none)."""
  if isinstance(config, str):
    config = config_lib.load_config_file(config)
  model = config['model']
  saved = json.loads(json.dumps(model.to_dict() if hasattr(model, 'to_dict') else dict(model)))
  dataset = config.get('dataset') or {}   # Its image size, where the weights do not tell it.
  weights = released.read_weights(checkpoint, saved, what='checkpoint',
                                  image_size=dataset.get('image_size'))
  model_config = overrides_lib.apply_routing_overrides(saved, **overrides)
  model = nn.build_model(model_config)
  overrides_lib.check_param_shapes(model, weights.param_shapes, overrides, weights.image_shape)
  model_state = nn.router_state.for_model(model, weights.image_shape, None)
  params = jax.device_put(weights.params, jax.local_devices()[0])
  meta = {'checkpoint': checkpoint, 'model_config': saved, 'param_shapes': weights.param_shapes}
  return LoadedModel(model, params, model_config, step=None, meta=meta, overrides=overrides,
                     batch_size=batch_size, model_state=model_state,
                     image_shape=weights.image_shape)
