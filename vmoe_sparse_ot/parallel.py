"""Device mesh ('data', 'expert'), shardings of params, optimizer state and batches, prefetch.

Parameters are replicated except those matching a partition rule (by default the
expert parameters, `nn.EXPERT_PARAMS_REGEX`, whose leading E axis is split over
'expert'). The batch is split over every device, i.e. over ('data', 'expert').
"""
from __future__ import annotations

import collections
import itertools
import math
import re
from typing import Any, Iterator, Mapping, Sequence

import jax
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from vmoe_sparse_ot import data as data_lib
from vmoe_sparse_ot.trees import path_name

AXES = ('data', 'expert')
PREFETCH = 2  # Batches put on the mesh ahead of the step that uses them.
BATCH_SPEC = P(AXES)


def make_mesh(mesh_config: Mapping[str, Any], devices: Sequence[Any] | None = None,
              num_experts: int | None = None) -> Mesh:
  """Mesh of shape (data, expert) over all (global) devices; data=-1 takes the rest.

  expert=-1 picks gcd(devices, num_experts): as many expert shards as both allow.
  """
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  expert, data = int(mesh_config['expert']), int(mesh_config['data'])
  if expert == -1:
    expert = math.gcd(n, int(num_experts or 1))
  if expert <= 0 or n % expert:
    raise ValueError(f'config.mesh.expert={expert} must be positive and divide the '
                     f'{n} devices')
  if data == -1:
    data = n // expert
  if data * expert != n:
    raise ValueError(f'config.mesh data x expert = {data} x {expert} must equal the number '
                     f'of devices {n} (use data=-1 for "the rest")')
  return jax.make_mesh((data, expert), AXES, axis_types=(AxisType.Auto,) * 2,
                       devices=devices)


def param_specs(params: Any, rules: Sequence[tuple[str, P]]) -> Any:
  """PartitionSpec per parameter: the first rule whose regex matches its path, else P()."""
  compiled = [(re.compile(regex), spec) for regex, spec in rules]

  def spec_for(path, _):
    name = path_name(path)
    for pattern, spec in compiled:
      if pattern.search(name):
        return spec
    return P()
  return jax.tree_util.tree_map_with_path(spec_for, params)


def check_divisible(abstract: Any, specs: Any, mesh: Mesh) -> None:
  """Fails naming the parameter whose sharded dimension the mesh axis does not divide."""
  def check(path, leaf, spec):
    for dim, axes in zip(leaf.shape, spec):
      if axes is None:
        continue
      size = int(np.prod([mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes)]))
      if dim % size:
        raise ValueError(f'parameter {path_name(path)} of shape {leaf.shape} cannot be split '
                         f'{size} ways over mesh axis {axes!r}: choose config.mesh.expert '
                         'dividing the number of experts')
  jax.tree_util.tree_map_with_path(check, abstract, specs)


def param_shardings(mesh: Mesh, abstract_params: Any, rules: Sequence[tuple[str, P]]) -> Any:
  specs = param_specs(abstract_params, rules)
  check_divisible(abstract_params, specs, mesh)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs)


def opt_state_shardings(tx: optax.GradientTransformation, abstract_state: Any,
                        params_shardings: Any, mesh: Mesh) -> Any:
  """Moments follow their parameter's sharding; counters etc. are replicated.

  Without this, optax's step `count` is created on device 0 only, and a jit with
  in_shardings rejects it.
  """
  replicated = NamedSharding(mesh, P())

  def follow(leaf, sharding):
    # A statistic shaped unlike its parameter (Adafactor's factored rows and
    # columns keep the leading expert axis; its (1,) placeholders do not) is
    # split as the parameter only where each split dimension still divides.
    return sharding if _fits(leaf.shape, sharding.spec, mesh) else replicated

  return optax.tree_map_params(
      tx, follow, abstract_state, params_shardings,
      transform_non_params=lambda _: replicated)


def _fits(shape: tuple[int, ...], spec: P, mesh: Mesh) -> bool:
  if len(spec) > len(shape):
    return False
  for dim, axes in zip(shape, spec):
    names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
    size = 1
    for name in names:
      size *= mesh.shape[name]
    if dim % size:
      return False
  return True


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, BATCH_SPEC)


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def prefetch_to_mesh(batches: Iterator[dict[str, np.ndarray]], sharding,
                     size: int = PREFETCH) -> Iterator[dict[str, jax.Array]]:
  """Global device batches, `size` transfers ahead (flax's prefetch_to_device, sharded)."""
  queue = collections.deque()

  def enqueue(n):
    for batch in itertools.islice(batches, n):
      queue.append(data_lib.to_global(batch, sharding))

  enqueue(size)
  while queue:
    yield queue.popleft()
    enqueue(1)
