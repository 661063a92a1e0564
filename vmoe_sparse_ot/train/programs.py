"""Jitted programs kept for the next run in this process built from the same things.

Each run builds its programs anew (closures over its model, optimizer and
shardings), and `jax.jit` caches traced and compiled programs per function
object: a second run in the same process would trace and compile them all
again, even with nothing changed -- most of a tiny run's time, paid by a sweep,
a retry or a test suite on every run. Here a program is kept under a key of
what it is built from, and a run whose key differs in anything builds its own.

Only the run builder (`train.run`) uses this cache, and it chooses, per
program, which part of the config the key holds (`run_key(..., only=...)`).
The whole run's key leaves out the entries that only drive the loop around the
programs (`LOOP_ONLY`: how many steps, when to checkpoint, evaluate or run
few-shot, the peak FLOP/s behind `mfu`; `train_steps` is keyed through the
schedule it resolves) and those
that only choose where a run starts (`START_ONLY`: the seed, whose keys are the
programs' arguments, and `initialization`). At most `MAX_KEYS` keys are kept,
the least recently used dropped first.
"""
from __future__ import annotations

import collections
import json
from typing import Any, Callable, Hashable

import jax

from vmoe_sparse_ot.train import optimizer as optimizer_lib

# Four runs' keys: each run has five, the whole run's and four of `only` (`train.run`).
MAX_KEYS = 20
# Config entries no kept function is built from (the trainer's loop reads them;
# few-shot evaluators are built per run, outside this cache).
LOOP_ONLY = ('train_steps', 'checkpoint', 'eval_every_steps', 'fewshot', 'profile',
             'peak_flops_per_device')
# Config entries that only choose where a run starts: its seed and
# `initialization` (a source of weights). No program is built from them: the
# random keys are the programs' arguments and the step's are state
# (`TrainState.rng`).
START_ONLY = ('seed', 'initialization')
_runs: collections.OrderedDict[Hashable, dict[str, Any]] = collections.OrderedDict()


def run_key(config, mesh, components: tuple = (), only: tuple[str, ...] | None = None) -> tuple:
  """The key of a run: `config` resolved to JSON (an object JSON cannot write
  is keyed by its repr, which names its address: never shared) less
  `LOOP_ONLY` and `START_ONLY`, with its schedule resolved for `train_steps`;
  the mesh's device ids, axis names and sizes, the process count, and
  `components` (the objects the config names, by identity). only: the key of
  a function built from these dotted config paths alone (e.g.
  `train.run.EVAL_FROM`; () for the mesh alone)."""
  built_from = {k: v for k, v in config.to_dict().items() if k not in LOOP_ONLY}
  built_from['schedule'] = optimizer_lib.resolved_schedule(config.schedule,
                                                           config.train_steps)
  if only is None:
    built_from = {k: v for k, v in built_from.items() if k not in START_ONLY}
  else:
    built_from = {path: _lookup(built_from, path) for path in only}
  return (json.dumps(built_from, sort_keys=True, default=repr),
          tuple(int(d.id) for d in mesh.devices.flat), tuple(dict(mesh.shape).items()),
          jax.process_count(), tuple(id(c) for c in components), _Held(components))


def _lookup(tree: dict, path: str) -> Any:
  for name in path.split('.'):
    tree = tree[name]
  return tree


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
    while len(_runs) > MAX_KEYS:
      _runs.popitem(last=False)
  else:
    _runs.move_to_end(key)
  if name not in functions:
    functions[name] = build()
  return functions[name]


def has(key: Hashable, name: str) -> bool:
  """Whether `get(key, name, ...)` would return a kept value (build nothing)."""
  return name in _runs.get(key, {})


def clear() -> None:
  """Forgets every kept function (their compiled programs go with them)."""
  _runs.clear()
