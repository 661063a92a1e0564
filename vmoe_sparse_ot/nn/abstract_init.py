"""The variables of a model traced for their shapes only: `model.init` under
`jax.eval_shape`, no array made, no random number drawn.

Every job that checks weights against a model (pre-flight, evaluation, released
weights, overrides) compares against these.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np

# Every stream a model's init may ask for; keys do not change shapes.
_RNG_STREAMS = ('params', 'gating', 'dropout')


def abstract_variables(model, image_shape: Sequence[int]) -> dict[str, Any]:
  """{collection: tree of jax.ShapeDtypeStruct} of `model.init` on images (H, W, C).

  Args:
    model: a Flax module called as `model(images, train=False)` (the project's
      `VisionTransformer`), e.g. from `nn.build_model`.
    image_shape: (H, W, C) of one image; the trace uses a batch of one float32 image.

  Returns:
    The variables `model.init` would return, as ShapeDtypeStructs: 'params' and,
    for a stateful router, 'router_state' (`nn.router_state.STATE`).

  Raises:
    Whatever `model.init` raises while tracing (ValueError for options the model
    or its router refuses).
  """
  image = jax.ShapeDtypeStruct((1, *image_shape), np.float32)
  return dict(jax.eval_shape(lambda x: model.init(
      {name: jax.random.key(0) for name in _RNG_STREAMS}, x, train=False), image))
