"""Names of nested things: dotted keys of a nested dict, slash paths of a jax tree.

The bottom of the package: imports nothing of it, so every layer can use it.
"""
from __future__ import annotations

from typing import Any, Mapping


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
