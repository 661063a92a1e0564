"""Mixup (Zhang et al. 2018) of a training batch: `config.mixup`.

Each example becomes a convex combination of itself and the `size` - 1 examples
before it (the batch rolled by 1, ..., size - 1), with the same weights for the
images and the float targets 'labels', so its mixed targets still sum to what
they summed to. The weights are drawn from a symmetric Dirichlet of concentration
`p` (for size 2: r ~ Beta(p, p), weights (r, 1 - r)) and sorted so that the
largest weight is the example's own: each example keeps most of itself. Sorting
matters for small p, where the weights are near 0 or 1: without it, about half
the examples would be replaced by a neighbour. The integer 'label' is left as it
is (the label of the largest part; training accuracy reads it).

Granularity (`config.mixup.granularity`), as the reference V-MoE code's:
- 'batch': one set of weights per step for the whole global batch, which is
  rolled as one (the roll crosses device boundaries). With size 2 this is the
  mixup of the configs that predate the option, bit for bit.
- 'device': one set of weights per device shard of the batch (the trainer splits
  the batch over every device of its mesh, in order). Each shard is rolled on its
  own, so no example crosses a device.
- 'example': one set of weights per example, the batch rolled per device shard as
  'device'.

The key is the train step's (derived from the step number), so a resumed run
mixes exactly as an uninterrupted one.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.config.schema import MIXUP_GRANULARITIES as GRANULARITIES

# Batch entries that are mixed; the rest (the integer 'label') are kept.
MIXED = ('image', 'labels')


class Mixup(NamedTuple):
  """The train step's mixup (`config.mixup`).

  p: the Beta(p, p) parameter of the mixing weights; 0 turns mixup off.
  granularity: 'batch' (one draw for the batch), 'device' (one per device shard)
    or 'example' (one per example, within its shard).
  size: how many images each mixed image is made of (>= 2).
  """
  p: float = 0.0
  granularity: str = 'batch'
  size: int = 2

  @classmethod
  def from_config(cls, mixup: Any) -> 'Mixup':
    """From `config.mixup`."""
    return cls(float(mixup.p), mixup.granularity, int(mixup.size))


def mix_ratio(key: jax.Array, p: float, shape: tuple[int, ...] = ()) -> jax.Array:
  """r ~ Beta(p, p) folded into [1/2, 1], of `shape`."""
  r = jax.random.beta(key, p, p, shape=shape, dtype=jnp.float32)
  return jnp.maximum(r, 1.0 - r)


def mix_weights(key: jax.Array, p: float, shape: tuple[int, ...], size: int = 2) -> jax.Array:
  """(size, *shape) mixing weights: along axis 0 they sum to 1 and decrease.

  size 2: (r, 1 - r) with r = `mix_ratio`; size > 2: a Dirichlet(p, ..., p)
  sample sorted in decreasing order.
  """
  if size == 2:
    r = mix_ratio(key, p, shape)
    return jnp.stack([r, 1.0 - r])
  w = jax.random.dirichlet(key, jnp.full((size,), p, jnp.float32), shape=shape)
  return jnp.moveaxis(-jnp.sort(-w, axis=-1), -1, 0)


def mix(x: jax.Array, weights: jax.Array, num_groups: int = 1) -> jax.Array:
  """Mixes `x` along its batch axis (axis 0), which holds `num_groups` equal groups.

  weights: (size, G, M) with G in (1, num_groups) and M in (1, examples per group):
  example j of group g becomes sum_i weights[i, g, j] x_{j - i}, j - i taken
  cyclically within the group. size 2 computes w x + (1 - w) x_{j - 1} with w the
  first weight, the arithmetic of the configs that predate `size`.
  """
  groups = x.reshape(num_groups, -1, *x.shape[1:])
  w = weights.astype(x.dtype).reshape(weights.shape + (1,) * (x.ndim - 1))
  if len(w) == 2:
    out = w[0] * groups + (1 - w[0]) * jnp.roll(groups, 1, axis=1)
  else:
    out = w[0] * groups
    for i in range(1, len(w)):
      out = out + w[i] * jnp.roll(groups, i, axis=1)
  return out.reshape(x.shape)


def weights_shape(granularity: str, num_shards: int, batch_size: int) -> tuple[int, int]:
  """(G, M): how many weight sets over the groups and within each group."""
  if granularity == 'batch':
    return (1, 1)
  if granularity == 'device':
    return (num_shards, 1)
  if granularity == 'example':
    return (num_shards, batch_size // num_shards)
  raise ValueError(f'mixup granularity must be one of {list(GRANULARITIES)}; '
                   f'got {granularity!r}')


def mesh_shards(axes: Sequence[str]) -> int:
  """How many shards a batch split over the mesh `axes` has under the current mesh
  (`jax.set_mesh`, read while tracing); 1 without a mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return 1
  shape = dict(mesh.shape)
  size = 1
  for axis in axes:
    size *= shape.get(axis, 1)
  return size


def mixup(key: jax.Array, batch: Mapping[str, jax.Array], p: float, *,
          granularity: str = 'batch', size: int = 2,
          num_shards: int = 1) -> dict[str, jax.Array]:
  """`batch` with its 'image' and 'labels' mixed with weights drawn with `key`.

  num_shards: the device shards the batch is split into, in order ('device' and
  'example' mix within each).
  """
  if 'labels' not in batch:
    raise ValueError("mixup needs float targets 'labels' in the batch (the pp string adds "
                     "them with onehot(K, key='label', key_result='labels'))")
  if size < 2:
    raise ValueError(f'mixup size must be >= 2; got {size}')
  batch_size = batch['image'].shape[0]
  groups = 1 if granularity == 'batch' else num_shards
  if batch_size % groups:
    raise ValueError(f'mixup: the batch of {batch_size} does not split into {groups} '
                     'device shards')
  # 'batch' with size 2 draws one Beta sample of shape (1, 1): the same bits as
  # the scalar draw of the configs that predate the options (tested).
  weights = mix_weights(key, p, weights_shape(granularity, groups, batch_size), size)
  return {k: mix(v, weights, groups) if k in MIXED else v for k, v in batch.items()}
