"""Reading a source of weights into a flat {name: array} dict, whatever its format.

`path` is one of:
- a workdir of this project (its `checkpoints/`): the newest checkpoint that
  restores, or `step`; names are this project's;
- a `.npz` file (the public ViT files' naming, or this project's export);
- a checkpoint prefix in the reference V-MoE code's partitioned format
  (`PREFIX.index` + `PREFIX.data-XXXXX-of-YYYYY`), its own naming.
Names come back converted to this project's (`names.to_ours`); names the table
does not know are kept as stored. The `.npz` file and the partitioned prefix
may be remote (`gs://...`): they are read through `vmoe_sparse_ot.filesystem`.
"""
from __future__ import annotations

import dataclasses
import os
import zipfile
from typing import Any

import numpy as np

from vmoe_sparse_ot import filesystem
from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot.trees import flatten_tree
from vmoe_sparse_ot.initialization import names as names_lib
from vmoe_sparse_ot.initialization import npz as npz_lib
from vmoe_sparse_ot.initialization import partitioned
from vmoe_sparse_ot.initialization.rules import InitializationError


@dataclasses.dataclass
class Source:
  """arrays: {name in this project's naming: array}; raw_names: {that name: name as stored}."""
  arrays: dict[str, np.ndarray]
  raw_names: dict[str, str]
  naming: str        # 'ours', 'vit' or 'vmoe': how the source names its parameters.
  description: str   # For the log: what was read.
  model_config: dict[str, Any] | None = None   # A workdir's model config.


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
  """The nested dict of a flat {'a/b/c': leaf} dict."""
  tree: dict[str, Any] = {}
  for name, leaf in flat.items():
    node = tree
    *parents, last = name.split('/')
    for p in parents:
      node = node.setdefault(p, {})
    node[last] = leaf
  return tree


def _is_workdir(path: str) -> bool:
  return os.path.isdir(os.path.join(path, workdir_layout.CHECKPOINTS))


def kind_of(path: str, what: str = 'initialization.path') -> str:
  """'workdir', 'npz' or 'partitioned'; InitializationError naming the key `what` otherwise.

  A remote path (`gs://...`, `filesystem.is_remote`) is a `.npz` file or a
  partitioned prefix; workdirs are read from local disk only.
  """
  if filesystem.is_remote(path):
    return _remote_kind(path, what)
  if partitioned.is_partitioned(path):
    return 'partitioned'
  if not os.path.exists(path):
    raise InitializationError(f'{what}: {path} does not exist')
  if os.path.isdir(path):
    if _is_workdir(path):
      return 'workdir'
    raise InitializationError(f'{what}: {path} is a directory without '
                              'checkpoints/ (not a workdir of this project)')
  if zipfile.is_zipfile(path):
    return 'npz'
  raise InitializationError(f'{what}: {path} is neither an .npz file, a workdir '
                            'nor a partitioned checkpoint prefix (PREFIX.index)')


def _remote_kind(path: str, what: str) -> str:
  try:
    if partitioned.is_partitioned(path):
      return 'partitioned'
    if not filesystem.exists(path):
      raise InitializationError(f'{what}: {path} does not exist (nor {path}.index)')
    if filesystem.isdir(path):
      raise InitializationError(f'{what}: {path} is a remote directory; from a remote file '
                                'system only a .npz file or a partitioned checkpoint prefix '
                                '(PREFIX.index) is read')
    with filesystem.open_binary(path) as f:
      is_zip = zipfile.is_zipfile(f)
  except OSError as e:
    raise InitializationError(f'{what}: {e}') from None
  if is_zip:
    return 'npz'
  raise InitializationError(f'{what}: {path} is neither an .npz file nor a partitioned '
                            'checkpoint prefix (PREFIX.index)')


def _read_workdir(path: str, step: int | None):
  # Reading Orbax checkpoints (with the fallback past damaged steps) is the
  # checkpoints package's job: one reader.
  import jax  # lazy: export's command line imports this module (its --help, before JAX)
  from vmoe_sparse_ot import checkpoints  # lazy: as jax (Orbax loads in seconds)
  try:
    params, meta, step = checkpoints.restore_params_with_meta(path, step)
  except (OSError, ValueError) as e:
    raise InitializationError(f'initialization.path: {e}') from None
  arrays = {k: np.asarray(jax.device_get(v)) for k, v in flatten_tree(params).items()}
  return arrays, f'workdir {path} (step {step})', meta.get('model_config')


_NAMING_TEXT = {'ours': "this project's names", 'vit': 'public ViT names',
                'vmoe': 'reference V-MoE names'}
_LAST: list = []   # [((path, step, mtime), Source)]: the last source read.


def _stamp(path: str) -> float:
  for candidate in (path + '.index', path):
    try:
      return filesystem.stat(candidate).mtime_ns
    except OSError:
      continue
  return -1


def read_source(path: str, step: int | None = None, *,
                what: str = 'initialization.path') -> Source:
  """The arrays at `path` under this project's names; see the module docstring.

  `path` may be remote (`gs://...`) for a `.npz` file or a partitioned prefix.
  Errors are InitializationError (or the readers' PartitionedFormatError and
  WeightsFileError, all ValueErrors) in one line; `what` names the setting
  that gave `path` (e.g. '--checkpoint'). The last source read is kept, so a
  check before training and the initialization itself read the files once.
  """
  key = (path if filesystem.is_remote(path) else os.path.abspath(path), step, _stamp(path))
  if _LAST and _LAST[0][0] == key:
    return _LAST[0][1]
  source = _read_source(path, step, what)
  _LAST[:] = [(key, source)]
  return source


def _read_source(path: str, step: int | None, what: str) -> Source:
  kind = kind_of(path, what)
  if step is not None and kind != 'workdir':
    raise InitializationError(f'initialization.step applies to workdirs only; {path} is '
                              f'a {kind} source')
  model_config = None
  if kind == 'workdir':
    raw, description, model_config = _read_workdir(path, step)
  elif kind == 'npz':
    raw, description = npz_lib.read_npz(path), f'.npz file {path}'
  else:
    raw, description = partitioned.read_partitioned(path), f'partitioned checkpoint {path}'
  raw = names_lib.strip_params_level(raw)
  naming = names_lib.detect_naming(raw)
  try:
    arrays, origin = names_lib.rename(raw, lambda n: names_lib.to_ours(n, naming))
  except ValueError as e:
    raise InitializationError(f'{what}: {path}: {e}') from None
  return Source(arrays=arrays, raw_names=origin, naming=naming,
                description=f'{description}, {_NAMING_TEXT[naming]}', model_config=model_config)
