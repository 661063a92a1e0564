"""Sharding annotations that are no-ops without a mesh.

The model is written for a mesh with axes ('data', 'expert') set by the caller
with `jax.set_mesh`. Inside it, `constrain` pins an array's layout with
`jax.lax.with_sharding_constraint`; outside a mesh, or when the mesh lacks an
axis, or when a dimension does not divide evenly, it returns the array as is, so
the same model code runs on one device and in tests.

`per_shard` runs a function on each device's own slice of its arguments
(`jax.shard_map`), for what XLA's partitioner cannot split by itself: a Pallas
kernel is one custom call, which the partitioner runs whole on every device,
after gathering its operands there.
"""
from typing import Callable, Optional, Sequence, Tuple, Union

import jax
from jax.sharding import PartitionSpec as P

AxisSpec = Optional[Union[str, Tuple[str, ...]]]
GROUP_AXES = ("data", "expert")   # the MoE layers' groups are split over every device
EXPERT_AXIS = "expert"


def _axis_size(mesh, axes: AxisSpec) -> int:
  if axes is None:
    return 1
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  size = 1
  for name in names:
    size *= mesh.shape[name]
  return size


def _kept_spec(mesh, shape: Sequence[int], spec: Sequence[AxisSpec]) -> Optional[P]:
  """`spec` as the mesh allows it (see `constrain`); None if nothing is left."""
  kept = []
  for dim, axes in zip(shape, spec):
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    names = tuple(n for n in names if n in mesh.axis_names)
    # Drop trailing axes until the dimension divides (('data', 'expert') -> 'data').
    while names and dim % _axis_size(mesh, names) != 0:
      names = names[:-1]
    kept.append(None if not names else (names[0] if len(names) == 1 else names))
  if all(a is None for a in kept):
    return None
  return P(*kept)


def constrain(x: jax.Array, spec: Sequence[AxisSpec]) -> jax.Array:
  """Applies `with_sharding_constraint(x, P(*spec))` when the current mesh allows it.

  Mesh axes in `spec` that the current mesh does not have are dropped, and so are
  trailing axes of an entry while its dimension is not divisible by their total
  size (XLA would reject it); if nothing is left, `x` is returned unchanged.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  kept = _kept_spec(mesh, x.shape, spec)
  return x if kept is None else jax.lax.with_sharding_constraint(x, kept)


def per_shard(fn: Callable[..., jax.Array], *args: jax.Array,
              axes: AxisSpec = GROUP_AXES) -> jax.Array:
  """fn(*args), each device computing it on its own slice of the leading axis.

  fn must treat the leading axis as a batch (each slice's result depends on that
  slice of every argument only), and return one array with the same leading axis.
  The axis is split over the mesh axes `axes`, kept as `constrain` keeps them
  (axes the current mesh lacks, or whose size does not divide the leading
  dimension, are dropped), and so is the result; on Explicit mesh axes the
  arguments are resharded to that split first. Without a mesh, or when nothing
  is left to split over (or only axes of size 1), this is fn(*args).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return fn(*args)
  kept = _kept_spec(mesh, args[0].shape[:1], (axes,))
  if kept is None or _axis_size(mesh, kept[0]) == 1:   # one device: the program as is
    return fn(*args)
  if mesh.explicit_axes:   # Explicit axes: the arguments' types must match in_specs
    args = tuple(jax.sharding.reshard(a, kept) for a in args)
  # check_vma=False: a pallas_call's output type does not say how it varies over
  # the mesh axes, which check_vma=True requires.
  return jax.shard_map(fn, mesh=mesh, in_specs=(kept,) * len(args), out_specs=kept,
                       check_vma=False)(*args)
