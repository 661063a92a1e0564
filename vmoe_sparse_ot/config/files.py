"""Loading config files: 'path.py[:key=value,...]' arguments, and flattening to dotted keys."""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import sys
import types
from typing import Any

import ml_collections

from vmoe_sparse_ot import filesystem
from vmoe_sparse_ot.config import reference
from vmoe_sparse_ot.trees import flatten  # noqa: F401  (re-exported: config.flatten)


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses a config-file argument 'k1=v1,k2=v2' over `defaults` (types follow them).

  `--config=configs/vmoe_tiny_mnist.py:router=sbase,steps=100` reaches
  `get_config('router=sbase,steps=100')`. Unknown keys and values of the wrong type
  fail with one line naming the key.
  """
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for item in arg.split(','):
    if '=' not in item:
      raise ValueError(f'config argument {item!r} is not key=value; valid keys: '
                       f'{sorted(defaults)}')
    key, value = (s.strip() for s in item.split('=', 1))
    if key not in defaults:
      raise ValueError(f'unknown config argument {key!r}; valid keys: {sorted(defaults)}')
    default = defaults[key]
    if isinstance(default, bool):
      if value.lower() not in ('1', 'true', 'yes', '0', 'false', 'no'):
        raise ValueError(f'config argument {key}={value!r} must be true or false')
      out[key] = value.lower() in ('1', 'true', 'yes')
    elif isinstance(default, (int, float)):
      try:
        out[key] = type(default)(value)
      except ValueError:
        raise ValueError(f'config argument {key}={value!r} must be '
                         f'{"an integer" if isinstance(default, int) else "a number"}'
                         ) from None
    else:
      out[key] = value
  return out


def pp_template(section: ml_collections.ConfigDict, template: str):
  """A pp string that follows keys of `section`: `{image_size}` reads its current value.

  `config.dataset.pp_eval = pp_template(config.dataset,
  'decode(channels={channels})|resize({image_size})|value_range(-1, 1)')` gives
  'decode(channels=1)|resize(28)|value_range(-1, 1)' while image_size is 28, and
  'resize(35)' once a command line or a script sets image_size to 35. Setting
  the pp key itself replaces the template. Returns an ml_collections
  FieldReference (a plain str when `template` names no key).
  """
  result = None
  for i, piece in enumerate(re.split(r'\{(\w+)\}', template)):
    if not piece:
      continue
    if i % 2:
      if piece not in section:
        raise KeyError(f'pp template {template!r}: no key {piece!r} in the section')
      piece = section.get_ref(piece).to_str()
    result = piece if result is None else result + piece
  return result if result is not None else template


def load_config_file(spec: str, *, translate: bool = True) -> ml_collections.ConfigDict:
  """Loads 'path/to/config.py[:arg]' the way `config_flags` does; a file in the
  reference V-MoE layout comes back translated (`config.reference.resolve`)
  unless `translate` is False (its own keys, as command-line overrides name them).

  The path may be remote (`gs://...`): its text is read through
  `vmoe_sparse_ot.filesystem` and run as a module whose `__file__` is the path.
  Raises FileNotFoundError (one line) when the file does not exist. Writes no
  bytecode beside the file or what it imports (`no_bytecode_written`).
  """
  path, _, arg = _split_spec(spec)
  with no_bytecode_written():
    module = _remote_module(path) if filesystem.is_remote(path) else _local_module(path)
    if not hasattr(module, 'get_config'):
      raise ValueError(f'config file {path!r} defines no get_config()')
    config = module.get_config(arg) if arg else module.get_config()
  if not translate:
    return config
  # A reference V-MoE config file becomes this project's config (config.reference).
  return reference.resolve(config)


def _split_spec(spec: str) -> tuple[str, str, str]:
  """'path.py:arg' -> (path, ':', arg); the ':' of a remote path's scheme is not the separator."""
  scheme, sep, rest = spec.partition('://')
  if sep and '/' not in scheme:
    path, colon, arg = rest.partition(':')
    return scheme + sep + path, colon, arg
  return spec.partition(':')


@contextlib.contextmanager
def no_bytecode_written():
  """While it is open, imports write no `__pycache__` (then the setting is restored).

  A config file, and the siblings it imports (a reference config's
  `from vmoe.configs.vmoe_paper import common`, found on PYTHONPATH), live in
  the user's folders, which may be read-only or shared: reading a config must
  not write beside it. Bytecode already there is still used.
  """
  before = sys.dont_write_bytecode
  sys.dont_write_bytecode = True
  try:
    yield
  finally:
    sys.dont_write_bytecode = before


def _local_module(path: str) -> types.ModuleType:
  """The config file at local `path`, imported as a module of its own (not in sys.modules)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'config file {path!r} not found'
                            + (' (it is a directory)' if os.path.isdir(path) else ''))
  module_spec = importlib.util.spec_from_file_location('_vmoe_config', path)
  if module_spec is None:
    raise FileNotFoundError(f'config file {path!r} is not a Python file')
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def _remote_module(path: str) -> types.ModuleType:
  """The config file at remote `path`, its text run as a module (nothing written locally)."""
  if not filesystem.isfile(path):
    raise FileNotFoundError(f'config file {path!r} not found'
                            + (' (it is a directory)' if filesystem.isdir(path) else ''))
  module = types.ModuleType('_vmoe_config')
  module.__file__ = path
  exec(compile(filesystem.read_text(path), path, 'exec'), module.__dict__)  # pylint: disable=exec-used
  return module
