"""values.is_int: the one integer check of every layer's option checks."""
import numpy as np
import pytest

from vmoe_sparse_ot.values import is_int


@pytest.mark.parametrize('value', [0, 1, -3, 2**70])
def test_python_ints_are_ints(value):
  assert is_int(value)
  assert is_int(value, numpy_ints=True)


@pytest.mark.parametrize('value', [True, False, np.bool_(True), 1.0, 3.5, '3', None, [1], (2,),
                                   float('nan')])
def test_bools_floats_and_others_are_not(value):
  assert not is_int(value)
  assert not is_int(value, numpy_ints=True)


@pytest.mark.parametrize('value', [np.int64(3), np.int32(-1), np.uint8(7)])
def test_numpy_integers_only_when_asked(value):
  assert not is_int(value)   # Config values must stay Python ints (written to JSON).
  assert is_int(value, numpy_ints=True)
