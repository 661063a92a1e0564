"""Pre-logit feature extraction of a frozen model over a dataset.

A dataset is one pass of padded, full batches `{'image': (b, H, W, C) float32,
'label': (b,) int, 'mask': (b,) bool}` (what `data.make_dataset(..., training=False)`
yields; b is the per-process batch size). The model is applied with `train=False`
and its `aux['pre_logits']` (b, D') kept for the rows whose mask is True; for an E³
model (`model.ensemble_size` M > 1) the mean of its M members' pre-logits.

With a mesh, each process's batch becomes one global array whose batch dimension
is split over all the mesh's axes, as the trainer splits its batch over 'data' and
'expert' (`jax.make_array_from_process_local_data`); the parameters keep the
shardings they carry, and the outputs are replicated so that every process ends up
with the features of the whole split.
"""
from typing import Callable, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from vmoe_sparse_ot.train import evaluation

Batch = Mapping[str, np.ndarray]
FeatureFn = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]


def make_feature_fn(model, *, mesh: Mesh | None = None) -> FeatureFn:
  """Returns `fn(params, batch, model_state=None) -> (features (b', D'), labels (b',),
  mask (b',))` on host; `model_state` is the router state to route with
  (`nn.router_state`; None or {} for a stateless router).

  b' is the global batch (b times the process count when sharded). One jit-compiled
  apply serves every batch, since batches are padded to a fixed size.
  """
  members = getattr(model, 'ensemble_size', 1)

  def apply(params, model_state, images, labels, mask):
    _, aux = model.apply({'params': params, **model_state}, images, train=False)
    features = aux['pre_logits']
    if members > 1:  # E³: the ensemble's representation, the members' mean pre-logits.
      features = features.reshape(images.shape[0], members, -1).mean(axis=1)
    return features, labels, mask

  if mesh is None:
    jitted = jax.jit(apply)

    def fn(params, batch, model_state=None):
      out = jitted(params, model_state or {}, batch['image'], batch['label'], batch['mask'])
      return tuple(np.asarray(o) for o in jax.device_get(out))
    return fn

  batch_sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
  jitted = jax.jit(apply, out_shardings=NamedSharding(mesh, PartitionSpec()))

  def sharded_fn(params, batch, model_state=None):
    global_batch = batch['image'].shape[0] * jax.process_count()
    if global_batch % mesh.size:
      raise ValueError(f'The global batch size {global_batch} must be a multiple of the '
                       f'number of devices in the mesh, {mesh.size}; change '
                       'config.fewshot.batch_size.')
    args = [jax.make_array_from_process_local_data(batch_sharding, np.asarray(batch[k]))
            for k in ('image', 'label', 'mask')]
    with jax.set_mesh(mesh):
      out = jitted(params, model_state or {}, *args)
    # Replicated outputs: every process holds the full global batch locally.
    return tuple(np.asarray(o.addressable_data(0)) for o in out)
  return sharded_fn


def extract(feature_fn: FeatureFn, params, dataset,
            model_state=None) -> tuple[np.ndarray, np.ndarray]:
  """Features (N, D') float32 and labels (N,) int64 of the unpadded examples of `dataset`
  (a `tf.data.Dataset`, one pass, or any iterable of dicts), read by the one
  evaluation loop (`train.evaluation.fold`).

  Raises:
    ValueError: the dataset yields no batch.
  """

  def unpadded(batch):
    f, y, m = feature_fn(params, batch, model_state)
    m = m.astype(bool)
    return [f[m].astype(np.float32)], [y[m].astype(np.int64)]

  out = evaluation.fold(unpadded, dataset, lambda a, b: (a[0] + b[0], a[1] + b[1]))
  if out is None:
    raise ValueError('The dataset yielded no batches.')
  return np.concatenate(out[0]), np.concatenate(out[1])
