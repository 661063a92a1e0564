"""Names of nested things: dotted keys of a nested dict, slash paths of a jax tree,
and the shapes of a tree's leaves compared by name.

The bottom of the package: imports nothing of it, so every layer can use it.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

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


def shape_differences(have: Mapping[str, Sequence[int]], want: Mapping[str, Sequence[int]],
                      labels: Optional[tuple[str, str]] = None) -> list[str]:
  """One line per name whose shape differs between two flat {name: shape} dicts.

  Args:
    have, want: {name: shape}; a shape is any sequence of ints (compared as lists).
    labels: None for 'name: [2, 3] -> [4, 3]' (have -> want); a pair
      (have_label, want_label), e.g. ('checkpoint', 'model'), for
      'name: checkpoint [2, 3], model [4, 3]'.

  Returns:
    The lines, sorted by name; a name missing on one side shows `ABSENT` there.
    [] when both dicts hold the same names with the same shapes.
  """
  have = {k: list(v) for k, v in have.items()}
  want = {k: list(v) for k, v in want.items()}
  out = []
  for name in sorted(set(have) | set(want)):
    a, b = have.get(name, ABSENT), want.get(name, ABSENT)
    if a != b:
      out.append(f'{name}: {a} -> {b}' if labels is None
                 else f'{name}: {labels[0]} {a}, {labels[1]} {b}')
  return out
