"""Sharding annotations that are no-ops without a mesh.

The model is written for a mesh with axes ('data', 'expert') set by the caller
with `jax.set_mesh`. Inside it, `constrain` pins an array's layout with
`jax.lax.with_sharding_constraint`; outside a mesh, or when the mesh lacks an
axis, or when a dimension does not divide evenly, it returns the array as is, so
the same model code runs on one device and in tests.
"""
from typing import Optional, Sequence, Tuple, Union

import jax
from jax.sharding import PartitionSpec as P

AxisSpec = Optional[Union[str, Tuple[str, ...]]]


def _axis_size(mesh, axes: AxisSpec) -> int:
  if axes is None:
    return 1
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  size = 1
  for name in names:
    size *= mesh.shape[name]
  return size


def constrain(x: jax.Array, spec: Sequence[AxisSpec]) -> jax.Array:
  """Applies `with_sharding_constraint(x, P(*spec))` when the current mesh allows it.

  Mesh axes in `spec` that the current mesh does not have are dropped, and so are
  trailing axes of an entry while its dimension is not divisible by their total
  size (XLA would reject it); if nothing is left, `x` is returned unchanged.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  kept = []
  for dim, axes in zip(x.shape, spec):
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    names = tuple(n for n in names if n in mesh.axis_names)
    # Drop trailing axes until the dimension divides (('data', 'expert') -> 'data').
    while names and dim % _axis_size(mesh, names) != 0:
      names = names[:-1]
    kept.append(None if not names else (names[0] if len(names) == 1 else names))
  if all(a is None for a in kept):
    return x
  return jax.lax.with_sharding_constraint(x, P(*kept))
