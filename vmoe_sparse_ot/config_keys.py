"""The one check for unknown config keys, shared by every config section.

Dependency-free (no JAX, no TensorFlow), so `nn`, `train`, `evaluate` and config
files can all use it without pulling in anything heavy.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping


def check_keys(cfg: Mapping[str, Any], valid: Iterable[str], where: str) -> None:
  """Raises ValueError naming the unknown keys of `cfg` and the valid ones.

  Args:
    cfg: a mapping (dict or ConfigDict) whose keys are checked.
    valid: the accepted key names (a mapping's keys work too).
    where: the full dotted path of `cfg`, e.g. 'config.model.encoder.moe.router'.

  The message is one line:
  "unknown key(s) ['routr'] in config.model.encoder.moe; valid keys: [...]".
  """
  valid = sorted(valid)
  unknown = sorted(set(cfg.keys()) - set(valid))
  if unknown:
    raise ValueError(f'unknown key(s) {unknown} in {where}; valid keys: {valid}')
