"""Reading other weights into flat {name: array} dicts and mapping them onto a model.

  source = read_source(path, step=None)            # workdir, .npz or partitioned prefix
  mapped = map_onto(source.arrays, target_shapes, parse_rules(rules), num_prefix_tokens=1)
  params = initialize(fresh_params, config.initialization)   # both, for the trainer

See `rules` for the defaults (upcycling, position-embedding zoom, new head) and
`names` for the table of the three namings.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from vmoe_sparse_ot.initialization.names import from_ours, to_ours
from vmoe_sparse_ot.initialization.npz import WeightsFileError, read_npz, write_npz
from vmoe_sparse_ot.initialization.rules import (InitializationError, Mapped, map_onto,
                                                 parse_rules)
from vmoe_sparse_ot.initialization.sources import Source, read_source, unflatten
from vmoe_sparse_ot.initialization.transforms import TRANSFORMS
from vmoe_sparse_ot.trees import flatten_tree  # re-exported: initialization.flatten_tree


def _listing(what: str, names: list[str], limit: int = 8) -> str:
  more = f', ... and {len(names) - limit} more' if len(names) > limit else ''
  return f'{len(names)} {what}: {", ".join(names[:limit])}{more}'


def plan(target: Mapping[str, Any], init_config: Mapping[str, Any], *,
         num_prefix_tokens: int) -> tuple[Mapped, Source]:
  """What `initialize` will do: the source read and mapped onto `target` {name: shape}.

  Raises InitializationError (one line) when the source does not fit, or when
  parameters stay unmatched and `raise_if_target_unmatched` /
  `raise_if_source_unmatched` say that is an error. Cheap to call twice: the
  last source read is kept (jobs check before training, then initialize).
  """
  source = read_source(init_config['path'], init_config.get('step'))
  mapped = map_onto(source.arrays, {k: tuple(v) for k, v in target.items()},
                    parse_rules(init_config.get('rules')), num_prefix_tokens=num_prefix_tokens)
  if mapped.uninitialized and init_config.get('raise_if_target_unmatched', True):
    raise InitializationError(
        'initialization: '
        + _listing('model parameter(s) not in the source', mapped.uninitialized)
        + ' (map them with initialization.rules, or set '
        'initialization.raise_if_target_unmatched=False to keep their fresh init)')
  unused = [source.raw_names[n] for n in mapped.unused]
  if unused and init_config.get('raise_if_source_unmatched', False):
    raise InitializationError(
        'initialization: ' + _listing('source entr(ies) unused', unused)
        + " (drop them with a rule (regex, ''), or set "
        'initialization.raise_if_source_unmatched=False)')
  return mapped, source


def initialize(fresh: Mapping[str, Any], init_config: Mapping[str, Any], *,
               num_prefix_tokens: int, log: Callable[[str], None] = print
               ) -> tuple[dict[str, np.ndarray], Mapped]:
  """{name: array} of the model's parameters, from `init_config.path` where it has them.

  `fresh` is the model's freshly initialized flat {name: array} dict: what the
  source does not provide keeps these values (cast to their dtypes otherwise).
  Logs one line per default that fired and the lists of unmatched names.
  """
  mapped, source = plan({k: np.shape(v) for k, v in fresh.items()}, init_config,
                        num_prefix_tokens=num_prefix_tokens)
  log(f'Initialized {len(mapped.params)} of {len(fresh)} parameters from '
      f'{source.description}')
  for line in mapped.log:
    log(line)
  if mapped.uninitialized:
    log('Kept fresh: ' + _listing('model parameter(s) not in the source', mapped.uninitialized))
  unused = [source.raw_names[n] for n in mapped.unused]
  if unused:
    log('Not used: ' + _listing('source entr(ies)', unused))
  out = {}
  for name, value in fresh.items():
    new = mapped.params.get(name)
    out[name] = np.asarray(value) if new is None else new.astype(np.asarray(value).dtype)
  return out, mapped


def initialize_sharded(fresh: Any, init_config: Mapping[str, Any], shardings: Any, *,
                       num_prefix_tokens: int, log: Callable[[str], None] = print) -> Any:
  """`initialize` over a params tree: the result laid out with `shardings` (same tree).

  Every process reads the source and places its own shards, so this runs the
  same on one device, on a mesh and across processes.
  """
  import jax  # lazy: export's command line imports this package; JAX loads when weights move
  flat = {k: np.asarray(jax.device_get(v)) for k, v in flatten_tree(fresh).items()}
  params, _ = initialize(flat, init_config, num_prefix_tokens=num_prefix_tokens, log=log)
  return jax.tree.map(
      lambda x, s: jax.make_array_from_callback(x.shape, s, lambda index: x[index]),
      unflatten(params), shardings)


__all__ = ['InitializationError', 'Mapped', 'Source', 'TRANSFORMS', 'WeightsFileError',
           'flatten_tree', 'from_ours', 'initialize', 'initialize_sharded', 'map_onto',
           'parse_rules', 'plan', 'read_npz', 'read_source', 'to_ours', 'unflatten', 'write_npz']
