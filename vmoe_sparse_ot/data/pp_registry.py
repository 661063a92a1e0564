"""The registry of preprocessing ops: name -> builder, and how a builder is wrapped.

A builder takes the op's arguments as a pp string writes them (`resize(224)`),
checks them in plain Python and returns the op: a function from an example dict
of tensors to an example dict. Building needs no TensorFlow, so that a config
with a bad pp string fails in one line before TensorFlow is imported; the ops'
modules therefore reach TensorFlow through `tf` below, a module that imports on
first attribute use.

Most ops transform one value: `image_op` registers a function of that
value (plus, for random ops, a stateless seed) and add the keywords `key` (the
entry read) and `key_result` (the entry written; default: `key`).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable

# Random ops read and advance this entry: an int64 (2,) stateless seed that the
# pipeline sets per example (training only) and removes after the last op.
SEED_KEY = '_seed'
# `ignore_no_labels` writes whether the example counts here (bool): the pipeline
# drops the others from training and masks them out of evaluation.
VALID_KEY = '__valid__'

Example = dict[str, Any]
Op = Callable[[Example], Example]


class _LazyModule:
  """`tf.x` imports TensorFlow on first use; cheap afterwards (sys.modules)."""

  def __init__(self, name: str):
    self._name = name

  def __getattr__(self, attr: str) -> Any:
    return getattr(importlib.import_module(self._name), attr)


tf: Any = _LazyModule('tensorflow')


@dataclasses.dataclass(frozen=True)
class OpSpec:
  """A registered op: its builder and whether it draws random numbers."""
  name: str
  builder: Callable[..., Op]
  random: bool

  def usage(self) -> str:
    """The call as it may be written, e.g. 'resize(size, method='bilinear', ...)'."""
    params = []
    for p in inspect.signature(self.builder).parameters.values():
      if p.kind is p.VAR_POSITIONAL:
        params.append(f'*{p.name}')
      elif p.default is p.empty:
        params.append(p.name)
      else:
        params.append(f'{p.name}={p.default!r}')
    return f'{self.name}({", ".join(params)})'


OPS: dict[str, OpSpec] = {}


def register(name: str, *, random: bool = False) -> Callable:
  """Registers `builder(*args, **kwargs) -> Op` under `name`."""

  def decorate(builder):
    if name in OPS:
      raise KeyError(f'pp op {name!r} is registered twice')
    OPS[name] = OpSpec(name, builder, random)
    return builder

  return decorate


def _keyed(name: str, make: Callable, default_key: str, random: bool) -> Callable[..., Op]:
  """Wraps `make(*args, **kw) -> f(value[, seed])` into a builder of dict ops."""
  signature = inspect.signature(make)
  keyword = inspect.Parameter.KEYWORD_ONLY
  params = [p for p in signature.parameters.values()]
  params += [inspect.Parameter('key', keyword, default=default_key),
             inspect.Parameter('key_result', keyword, default=None)]

  def builder(*args, key=default_key, key_result=None, **kwargs) -> Op:
    for what, value in (('key', key), ('key_result', key_result)):
      if not (isinstance(value, str) and value) and not (what == 'key_result' and value is None):
        raise ValueError(f'{what}={value!r} must be the name of an entry')
    fn = make(*args, **kwargs)

    def op(data: Example) -> Example:
      data = dict(data)
      value = get(data, key, name)
      if random:
        data[SEED_KEY], seed = split_seed(data, name)
        data[key_result or key] = fn(value, seed)
      else:
        data[key_result or key] = fn(value)
      return data

    return op

  builder.__signature__ = signature.replace(parameters=params)
  builder.__name__ = builder.__qualname__ = name
  builder.__doc__ = make.__doc__
  return builder


def image_op(name: str, *, random: bool = False) -> Callable:
  """Registers `make(*args) -> f(image[, seed]) -> image` as op `name` on 'image'."""
  return lambda make: register(name, random=random)(_keyed(name, make, 'image', random))


def get(data: Example, key: str, op: str) -> Any:
  """`data[key]`, or a one-line error naming the op and the entries there are."""
  if key not in data:
    shown = sorted(k for k in data if k != SEED_KEY)
    raise ValueError(f'pp op {op!r} reads entry {key!r}, which the example does not have '
                     f'(entries: {", ".join(shown)}); pass key=...')
  return data[key]


def split_seed(data: Example, op: str) -> tuple[Any, Any]:
  """(the example's next seed, a seed for this op), from `data[SEED_KEY]`."""
  if SEED_KEY not in data:
    raise ValueError(f'pp op {op!r} is random and needs a per-example seed: random ops '
                     'belong in pp_train (evaluation preprocessing is deterministic)')
  seeds = tf.random.experimental.stateless_split(data[SEED_KEY], 2)
  return seeds[0], seeds[1]
