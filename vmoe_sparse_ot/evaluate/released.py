"""A checkpoint without a workdir (a released one) on the model a config describes.

    weights = read_weights('gs://.../vmoe_s32_last2_ilsvrc2012_randaug_light1', config.model)
    weights.params        # the model's parameter tree (numpy, the model's dtypes)

The checkpoint is a partitioned prefix of the reference V-MoE code (PREFIX.index +
PREFIX.data-*) or a `.npz` file, local or remote (`gs://...`); it is read by
`initialization.read_source` and its names mapped by the project's naming table
(`initialization.names`). The image size is the checkpoint's, read from its
patch embedding and position embedding (`overrides.image_shape`); a model with
no position-embedding parameter ('sincos2d' or 'none') takes the config's
dataset.image_size.

Evaluation takes the weights as they are: every parameter of the model must come
from the checkpoint with its exact shape. Nothing is adapted: the defaults that
`config.initialization` applies when a run starts from other weights (a resized
position embedding, a fresh head, upcycled experts) are refused here, as are
model parameters the checkpoint lacks and checkpoint parameters the model lacks
(a deeper checkpoint than the config's model). A layout of the same parameters
is no adaptation: the reference's E³ router kernel (D, M, E/M) is read as the
model's (D, E), as initialization reads it. Entries outside the model's
parameter names (an optimizer state, a step counter) are ignored and listed.
Every refusal is one line naming `what` (the flag or argument) and the path.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from vmoe_sparse_ot import initialization
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn.abstract_init import abstract_variables
from vmoe_sparse_ot.errors import first_line
from vmoe_sparse_ot.evaluate import overrides as overrides_lib
from vmoe_sparse_ot.trees import flatten_tree


@dataclasses.dataclass(frozen=True)
class Weights:
  """params: nested {name: array} tree for `model.apply`; param_shapes {'a/b': shape};
  image_shape (H, W, C) the checkpoint was made for; description of the source for
  logs; ignored: source entries outside the model's parameter names."""
  params: dict[str, Any]
  param_shapes: dict[str, list[int]]
  image_shape: tuple[int, int, int]
  description: str
  ignored: list[str]


def _listing(names: list[str], limit: int = 6) -> str:
  more = f', ... and {len(names) - limit} more' if len(names) > limit else ''
  return ', '.join(names[:limit]) + more


def target_params(model_config: Mapping[str, Any], image_shape: tuple[int, int, int]
                  ) -> dict[str, Any]:
  """{name: jax.ShapeDtypeStruct} of the parameters of the model of `model_config`."""
  return flatten_tree(abstract_variables(nn.build_model(model_config), image_shape)['params'])


def read_weights(checkpoint: str, model_config: Mapping[str, Any], *,
                 what: str = '--checkpoint', image_size: int | None = None) -> Weights:
  """The checkpoint's arrays as the parameters of the model of `model_config` (a dict).

  `image_size`: the config's dataset.image_size, the image side of a model with no
  position-embedding parameter (which does not tell it).

  Raises ValueError (InitializationError, PartitionedFormatError, WeightsFileError
  among them), one line starting with `what`, when the checkpoint is missing,
  unreadable or not exactly this model's weights.
  """
  try:
    source = initialization.read_source(checkpoint, what=what)
  except ValueError as e:   # The readers' messages name the file, not the flag.
    text = first_line(e)
    raise ValueError(text if text.startswith(what) else f'{what}={checkpoint}: {text}') from None
  shapes = {name: list(np.shape(a)) for name, a in source.arrays.items()}
  classifier = model_config['classifier']
  try:
    image_shape = overrides_lib.image_shape(shapes, classifier, image_size)
  except KeyError as e:
    raise ValueError(f'{what}={checkpoint}: holds no {e.args[0]} (after renaming from '
                     f'{source.description}): not the weights of a ViT') from None
  except ValueError as e:
    raise ValueError(f'{what}={checkpoint}: {e}') from None
  target = target_params(model_config, image_shape)
  try:
    mapped = initialization.map_onto(
        source.arrays, {k: tuple(v.shape) for k, v in target.items()},
        num_prefix_tokens=1 if classifier == 'token' else 0)
  except initialization.InitializationError as e:
    raise ValueError(f"{what}={checkpoint}: does not fit the config's model: {e}") from None
  roots = {name.split('/')[0] for name in target}
  extra = [source.raw_names[n] for n in mapped.unused if n.split('/')[0] in roots]
  # A default adapted something: not the checkpoint's model (a layout is no adaptation).
  problems = [line for line in mapped.log if line not in mapped.layouts]
  missing = sorted(set(target) - set(mapped.params))
  if missing:
    problems.append(f'{len(missing)} model parameter(s) not in it: {_listing(missing)}')
  if extra:
    problems.append(f"{len(extra)} of its parameter(s) not in the config's model: "
                    f'{_listing(extra)}')
  if problems:
    raise ValueError(f"{what}={checkpoint}: does not fit the config's model ("
                     + '; '.join(problems) + ')')
  params = {name: np.asarray(mapped.params[name], dtype=target[name].dtype) for name in target}
  ignored = sorted(source.raw_names[n] for n in mapped.unused if n.split('/')[0] not in roots)
  return Weights(params=initialization.unflatten(params),
                 param_shapes={name: list(a.shape) for name, a in params.items()},
                 image_shape=image_shape, description=source.description, ignored=ignored)


__all__ = ['Weights', 'read_weights', 'target_params']
