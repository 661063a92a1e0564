"""Names of nested things: dotted keys of a nested dict, slash paths of a jax tree,
and two flat dicts (of shapes, of config values) compared name by name.

The bottom of the package: imports nothing of it, so every layer can use it.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

ABSENT = '<absent>'


def flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'a.b.c': leaf} of a nested dict (tuples become lists, as JSON returns them)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = list(value) if isinstance(value, tuple) else value
  return out


def path_name(path) -> str:
  """'encoder/encoderblock_1/moe/experts/wi_kernel' for a jax tree key path."""
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', k))) for k in path)


def flatten_tree(tree: Any) -> dict[str, Any]:
  """{'a/b/c': leaf} of a pytree (nested dicts, FrozenDicts, dataclasses, ...).

  Names are `path_name`s of jax's key paths ('a/[0]/b' under a list), in jax's
  leaf order (dict keys sorted); None and empty subtrees have no leaves, so no entries.
  """
  import jax  # lazy: command lines import trees (export's --help answers before JAX loads)
  return {path_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def leaf_shapes(tree: Any) -> dict[str, list[int]]:
  """{'a/b/kernel': [d0, d1, ...]} of a pytree of arrays or ShapeDtypeStructs
  (shapes as lists, as they come back from JSON checkpoint metadata)."""
  return {name: list(np.shape(leaf)) for name, leaf in flatten_tree(tree).items()}


def differences(have: Mapping[str, Any], want: Mapping[str, Any],
                labels: Optional[tuple[str, str]] = None,
                show: Callable[[Any], str] = str) -> list[str]:
  """One line per name whose value differs between two flat {name: value} dicts.

  Args:
    have, want: {name: value}, values compared with ==.
    labels: None for 'name: HAVE -> WANT'; a pair (have_label, want_label), e.g.
      ('checkpoint', 'config'), for 'name: checkpoint HAVE, config WANT'.
    show: how a value is written (str; repr for config values, so strings show quoted).

  Returns:
    The lines, sorted by name; a name missing on one side shows `show(ABSENT)`
    there. [] when both dicts hold the same names with equal values.
  """
  out = []
  for name in sorted(set(have) | set(want)):
    a, b = have.get(name, ABSENT), want.get(name, ABSENT)
    if a != b:
      out.append(f'{name}: {show(a)} -> {show(b)}' if labels is None
                 else f'{name}: {labels[0]} {show(a)}, {labels[1]} {show(b)}')
  return out


def shape_differences(have: Mapping[str, Sequence[int]], want: Mapping[str, Sequence[int]],
                      labels: Optional[tuple[str, str]] = None) -> list[str]:
  """`differences` of two flat {name: shape} dicts, shapes compared and written as lists:
  'name: [2, 3] -> [4, 3]', or with labels=('checkpoint', 'model')
  'name: checkpoint [2, 3], model [4, 3]'; `ABSENT` for a missing name."""
  return differences({k: list(v) for k, v in have.items()},
                     {k: list(v) for k, v in want.items()}, labels)
