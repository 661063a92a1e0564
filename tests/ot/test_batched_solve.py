"""`ot.batched_semi_dual` (ot/batched_solve.py): which Adam path 'auto' picks,
that each path it dispatches to is that path's own function, and its checks."""
import numpy as np
import pytest

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import batched, batched_solve, candidates, pallas_solve


@pytest.mark.parametrize("m,n,k,backend,path", [
    (400, 32, 28, "cpu", "candidates"),   # k >= 20 with m >= 3 k (the B/32 router)
    (64, 8, 16, "cpu", "fast"),           # k <= 16, short groups, few experts
    (320, 32, 4, "cpu", "candidates"),    # long groups with many experts
    (300, 32, 4, "cpu", "fast"),          # one row short of that
    (50, 4, 25, "cpu", "fast"),           # 2 k = m: candidates does not apply
    (400, 32, 28, "gpu", "fast"),
])
def test_auto_picks_the_adam_path_by_the_rule(m, n, k, backend, path):
  assert batched_solve.adam_path(m, n, k, backend) == path


@pytest.mark.parametrize("implementation,module,name", [
    ("fast", batched, "batched_semi_dual_adam"),
    ("candidates", candidates, "batched_semi_dual_adam_candidates"),
    ("pallas", pallas_solve, "batched_semi_dual_adam_pallas"),
    ("auto", candidates, "batched_semi_dual_adam_candidates"),   # on the CPU, at k = 20
])
def test_each_adam_path_calls_its_own_function(implementation, module, name, monkeypatch):
  """The path's function gets the problem and the options (stubs: nothing runs)."""
  calls = []

  def stub(C, a, b, k, gamma, steps, lr, return_alpha):
    calls.append((C.shape, k, gamma, steps, lr, return_alpha))
    return np.zeros(C.shape), np.zeros(a.shape)

  monkeypatch.setattr(module, name, stub)
  C, a, b = np.zeros((2, 64, 3)), np.ones((2, 64)), np.full((2, 3), 64 / 3)
  res = ot.batched_semi_dual(C, a, b, 20, 0.5, solver="adam", max_steps=7, learning_rate=0.05,
                             implementation=implementation)
  assert calls == [((2, 64, 3), 20, 0.5, 7, 0.05, True)]
  np.testing.assert_array_equal(np.asarray(res.steps), [7, 7])
  assert np.asarray(res.converged).all()


@pytest.mark.parametrize("kwargs,match", [
    ({"solver": "sgd"}, "solver must be one of"),
    ({"max_steps": 0}, "max_steps must be an int >= 1"),
    ({"implementation": "gpu"}, "implementation must be one of"),
    ({"k": 0}, "k must be an int >= 1"),
])
def test_bad_arguments_are_one_line_naming_the_argument(kwargs, match):
  C, a, b = np.zeros((1, 8, 2)), np.ones((1, 8)), np.full((1, 2), 4.0)
  kw = {"k": 2, **kwargs}
  with pytest.raises(ValueError, match=match) as err:
    ot.batched_semi_dual(C, a, b, **kw)
  assert "\n" not in str(err.value)
