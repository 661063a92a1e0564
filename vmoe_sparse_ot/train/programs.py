"""A run's jitted functions, kept for the next run in this process with the same config.

Each run builds its functions anew (closures over its model, optimizer and
keys), and `jax.jit` caches traced and compiled programs per function object:
a second `train_and_evaluate` in the same process traced and compiled them all
again, even with nothing changed. On the tiny test model that was 20 of a
25-second run (4 programs, 14 s to compile and 6 s to trace, measured under
load on this project's 2-core machine); a sweep, a retry or a test suite
paid it on every run.

Here they are kept under a key of everything they are built from: the
resolved config (model, optimizer, schedule, loss, seed, batch sizes...), the
mesh (its devices and axes), the process count and the router and loss
objects the config names (a router registered anew under the same name is
another key). A run whose key differs in anything builds its own, as before.
At most `MAX_RUNS` keys are kept, the least recently used dropped first.
"""
from __future__ import annotations

import collections
import json
from typing import Any, Callable, Hashable

import jax

MAX_RUNS = 4
_runs: collections.OrderedDict[Hashable, dict[str, Any]] = collections.OrderedDict()


def run_key(config, mesh, components: tuple = ()) -> tuple:
  """The key of a run: `config` resolved to JSON (an object JSON cannot write
  is keyed by its repr, which names its address: never shared), the mesh's
  device ids, axis names and sizes, the process count, and `components` (the
  objects the config names, by identity)."""
  return (json.dumps(config.to_dict(), sort_keys=True, default=repr),
          tuple(int(d.id) for d in mesh.devices.flat), tuple(dict(mesh.shape).items()),
          jax.process_count(), tuple(id(c) for c in components), _Held(components))


class _Held:
  """Objects carried in a key without being part of its hash or equality."""

  def __init__(self, objects):
    self.objects = objects

  def __hash__(self):
    return 0

  def __eq__(self, other):
    return isinstance(other, _Held)


def get(key: Hashable, name: str, build: Callable[[], Any]) -> Any:
  """The value `build()` returned for this run key and name, built on first use."""
  functions = _runs.get(key)
  if functions is None:
    # The key names its components by id and holds them (`_Held`), so no
    # other object can take those ids while the entry exists.
    functions = _runs[key] = {}
    while len(_runs) > MAX_RUNS:
      _runs.popitem(last=False)
  else:
    _runs.move_to_end(key)
  if name not in functions:
    functions[name] = build()
  return functions[name]


def clear() -> None:
  """Forgets every kept function (their compiled programs go with them)."""
  _runs.clear()
