"""Checks of plain values shared by the option checks of every layer.

A foundation: imports nothing of the package, so every layer can use it.
"""
from __future__ import annotations

import numbers
from typing import Any

import numpy as np


def is_int(value: Any, *, numpy_ints: bool = False) -> bool:
  """Whether `value` is an integer, and not a bool.

  Args:
    value: anything.
    numpy_ints: also accept NumPy integer scalars (np.int64(3), ...), for an API
      whose callers compute values with NumPy; config values stay Python ints
      (they are written to JSON), so config checks leave it False.

  Returns:
    True for a Python int (and, with `numpy_ints`, any `numbers.Integral`), False
    for bool and np.bool_ (True is not 1 here), floats (3.0 included), strings, None.
  """
  if numpy_ints:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
  return isinstance(value, int) and not isinstance(value, bool)
