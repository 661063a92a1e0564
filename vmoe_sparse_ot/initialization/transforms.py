"""Transforms applied to a source array on its way to a target parameter.

Each is `fn(array, target_shape, context) -> array` and registered by name in
`TRANSFORMS`; a rule names one as its third element. `context` carries what a
transform cannot read from shapes (`num_prefix_tokens`: 1 with a class token).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

Transform = Callable[[np.ndarray, Sequence[int], Mapping[str, Any]], np.ndarray]


def upcycle(array: np.ndarray, target_shape: Sequence[int], context) -> np.ndarray:
  """A dense MLP parameter copied into every expert: (...) -> (E, ...), E = target_shape[0].

  Sparse upcycling (Komatsuzaki et al. 2023): every expert starts as the dense
  MLP it replaces, so the upcycled layer computes s times the dense MLP for a
  token whose combine weights sum to s.
  """
  del context
  if tuple(target_shape[1:]) != array.shape:
    raise ValueError(f'upcycle: source shape {array.shape} is not the per-expert shape '
                     f'{tuple(target_shape[1:])} of target shape {tuple(target_shape)}')
  return np.broadcast_to(array[None], tuple(target_shape)).copy()


def _grid(tokens: int, what: str) -> int:
  side = math.isqrt(tokens)
  if side * side != tokens:
    raise ValueError(f'zoom_posemb: the {what} has {tokens} patch tokens, not a square grid')
  return side


def zoom_posemb(array: np.ndarray, target_shape: Sequence[int], context) -> np.ndarray:
  """Position embedding (1, P + h*w, D) -> (1, P + h'*w', D): the patch grid resized.

  P = `context['num_prefix_tokens']` leading tokens (the class token) are kept;
  the grid is resized bilinearly with corners aligned (scipy's zoom, order 1),
  as the ViT and V-MoE reference code does when fine-tuning at another resolution.
  """
  prefix = int(context.get('num_prefix_tokens', 0))
  if array.ndim != 3 or len(target_shape) != 3 or array.shape[-1] != target_shape[-1]:
    raise ValueError(f'zoom_posemb: expects (1, tokens, D) arrays with the same D, got '
                     f'{array.shape} -> {tuple(target_shape)}')
  old = _grid(array.shape[1] - prefix, 'source')
  new = _grid(target_shape[1] - prefix, 'target')
  head, grid = array[:, :prefix], array[0, prefix:].reshape(old, old, -1)
  if new != old:
    import scipy.ndimage  # pylint: disable=g-import-not-at-top  (config checks import us)
    grid = scipy.ndimage.zoom(grid.astype(np.float64), (new / old, new / old, 1), order=1)
  grid = grid.reshape(1, new * new, -1).astype(array.dtype)
  return np.concatenate([head, grid], axis=1)


def reshape(array: np.ndarray, target_shape: Sequence[int], context) -> np.ndarray:
  """The same values in the target's shape (sizes must agree)."""
  del context
  if int(np.prod(target_shape)) != array.size:
    raise ValueError(f'reshape: cannot reshape {array.shape} ({array.size} values) into '
                     f'{tuple(target_shape)}')
  return array.reshape(tuple(target_shape))


TRANSFORMS: dict[str, Transform] = {
    'upcycle': upcycle,
    'zoom_posemb': zoom_posemb,
    'reshape': reshape,
}
