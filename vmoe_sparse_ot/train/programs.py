"""A run's jitted functions, kept for the next run in this process with the same config.

Each run builds its functions anew (closures over its model, optimizer and
keys), and `jax.jit` caches traced and compiled programs per function object:
a second `train_and_evaluate` in the same process traced and compiled them all
again, even with nothing changed: most of a tiny run's time
(benchmarks/RESULTS.md, "Training throughput"), paid by a sweep, a retry or a
test suite on every run.

Here they are kept under a key of everything they are built from: the
resolved config (model, optimizer, schedule, loss, seed, batch sizes...), the
mesh (its devices and axes), the process count and the router and loss
objects the config names (a router registered anew under the same name is
another key). A run whose key differs in anything builds its own, as before.
Left out are the entries that only drive the loop around the functions
(`LOOP_ONLY`: how many steps, when to checkpoint, evaluate or run few-shot):
`train_steps` is keyed through the schedule it resolves (a decay that runs
until the last step), so a longer run of the same schedule, or one that
checkpoints more often, reuses the programs. So are the entries that only
choose where a run starts (`START_ONLY`: the seed, `initialization`): runs over
seeds, or from scratch beside one from other weights, share one train step.

Some functions are built from less than the whole config, and are kept under
a key of only that (`run_key(..., only=...)`): the initializing programs and
abstract shapes (`INIT_FROM`: the model, its input shape, the optimizer and
the seed), the evaluation step (`EVAL_FROM`: the model, its evaluation
overrides, the image size (it counts tokens per image) and the loss) and the
finiteness check of the state (`only=()`: the mesh alone). A
run that differs elsewhere -- another learning rate, batch size, loss or
logging interval (each its own train step) -- reuses them: in a sweep over
learning rates in one process, each run compiles its train step only. At
most `MAX_KEYS` keys are kept, the least recently used dropped first.
"""
from __future__ import annotations

import collections
import json
from typing import Any, Callable, Hashable

import jax

from vmoe_sparse_ot.train import optimizer as optimizer_lib

# Four runs' keys: the whole run's and the three of `only` (init, eval, mesh).
MAX_KEYS = 16
# Config entries no kept function is built from (the trainer's loop reads them;
# few-shot evaluators are built per run, outside this cache).
LOOP_ONLY = ('train_steps', 'checkpoint', 'eval_every_steps', 'fewshot', 'profile')
# Config entries that only choose where a run starts: its seed and
# `initialization` (a source of weights). The whole run's functions (the train
# step, its metrics) are not built from them -- the step's random keys are state
# (`TrainState.rng`) -- so they are left out of the run's key; the initializing
# programs are keyed by the seed (`INIT_FROM`).
START_ONLY = ('seed', 'initialization')
# What the initializing programs (params, model state, optimizer state) and
# the abstract shapes are built from: dotted config paths. Not the schedule:
# the optimizer state starts from a step count, whatever the learning rates
# (tests/train/test_optimizer.py checks it for each optimizer).
INIT_FROM = ('model', 'dataset.image_size', 'dataset.channels', 'optimizer', 'seed')
# What the evaluation step is built from (the eval batch's shape is the
# input's: jit compiles per shape).
EVAL_FROM = ('model', 'loss', 'evaluate.model_overrides', 'dataset.image_size')
_runs: collections.OrderedDict[Hashable, dict[str, Any]] = collections.OrderedDict()


def run_key(config, mesh, components: tuple = (), only: tuple[str, ...] | None = None) -> tuple:
  """The key of a run: `config` resolved to JSON (an object JSON cannot write
  is keyed by its repr, which names its address: never shared) less
  `LOOP_ONLY` and `START_ONLY`, with its schedule resolved for `train_steps`;
  the mesh's device ids, axis names and sizes, the process count, and
  `components` (the objects the config names, by identity). only: the key of
  a function built from these dotted config paths alone (`INIT_FROM`,
  `EVAL_FROM`; () for the mesh alone)."""
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
