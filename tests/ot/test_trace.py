"""solve(..., trace=True): per-iteration objective, gradient norm, evaluations."""
import jax
import numpy as np
import pytest

from tests.ot.helpers import problem
from vmoe_sparse_ot import ot

REGS = {"sparse": ot.SparsityConstrained(k=3, gamma=0.1), "l2": ot.SquaredL2(0.1)}


def _check_layout(res, max_iter):
  tr = res.trace
  assert isinstance(tr, ot.OTTrace)
  for f in tr:
    assert f.shape == (max_iter,)
  n = int(res.num_iter)
  v, g, e = (np.asarray(f) for f in tr)
  assert np.isfinite(v[:n]).all() and np.isfinite(g[:n]).all()
  assert np.isnan(v[n:]).all() and np.isnan(g[n:]).all()
  np.testing.assert_array_equal(e[n:], int(res.num_evals))
  assert (np.diff(e[:n]) >= 1).all()          # at least one evaluation per iteration
  assert e[n - 1] == int(res.num_evals)
  # The last recorded entry is the returned solution.
  assert v[n - 1] == pytest.approx(float(res.value), rel=1e-12, abs=1e-14)
  assert g[n - 1] == pytest.approx(float(res.grad_norm), rel=1e-12)
  return v[:n], g[:n], e[:n]


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
@pytest.mark.parametrize("reg", sorted(REGS))
def test_lbfgs_trace_increases_and_ends_at_result(formulation, reg):
  a, b, C = problem(12, 9, seed=1, uniform=False)
  res = ot.solve(a, b, C, REGS[reg], formulation=formulation, max_iter=300, tol=1e-9,
                 trace=True)
  assert int(res.num_iter) > 5
  v, g, e = _check_layout(res, 300)
  # Armijo steps: the maximised objective never decreases.
  assert (np.diff(v) >= -1e-14 * np.abs(v[1:])).all()
  assert v[-1] > v[0]
  assert g[-1] < 1e-3 * g[0]


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
def test_adam_trace_matches_shorter_runs(formulation):
  """Entry i equals the value of a fresh run of i + 1 iterations (fixed length)."""
  a, b, C = problem(8, 6, seed=2)
  reg = REGS["sparse"]
  kw = dict(formulation=formulation, solver=ot.Adam(learning_rate=1e-2), tol=0.0)
  res = ot.solve(a, b, C, reg, max_iter=20, trace=True, **kw)
  v, g, e = _check_layout(res, 20)
  np.testing.assert_array_equal(e, np.arange(2, 22))
  for i in (0, 6, 19):
    short = ot.solve(a, b, C, reg, max_iter=i + 1, **kw)
    assert v[i] == pytest.approx(float(short.value), rel=1e-12)
    assert g[i] == pytest.approx(float(short.grad_norm), rel=1e-12)


def test_adam_with_tol_stops_and_pads():
  a, b, C = problem(8, 6, seed=3)
  res = ot.solve(a, b, C, ot.SquaredL2(1.0), solver=ot.Adam(learning_rate=1e-2),
                 max_iter=2000, tol=1e-4, trace=True)
  assert bool(res.converged) and int(res.num_iter) < 2000
  v, g, e = _check_layout(res, 2000)
  np.testing.assert_array_equal(e, np.arange(2, int(res.num_iter) + 2))
  assert g[-1] <= 1e-4 < g[-2]


def test_trace_off_is_none_and_same_result():
  # (The size and budget of test_lbfgs_trace_increases_and_ends_at_result:
  # its traced solve is compiled.)
  a, b, C = problem(12, 9, seed=4)
  reg = REGS["sparse"]
  off = ot.solve(a, b, C, reg, max_iter=300, tol=1e-8)
  on = ot.solve(a, b, C, reg, max_iter=300, tol=1e-8, trace=True)
  assert off.trace is None
  np.testing.assert_array_equal(np.asarray(off.alpha), np.asarray(on.alpha))
  assert int(off.num_iter) == int(on.num_iter)


def test_trace_under_jit_and_vmap():
  a, b, C = problem(9, 6, seed=5)
  Cs = np.stack([C, 2 * C])
  reg = REGS["sparse"]
  f = jax.jit(jax.vmap(lambda c: ot.solve(a, b, c, reg, max_iter=50, tol=1e-9, trace=True)))
  # On the host: eager indexing and slicing would compile a program each.
  out = jax.tree_util.tree_map(np.asarray, f(Cs))
  assert out.trace.value.shape == (2, 50)
  for i in range(2):
    single = jax.tree_util.tree_map(
        np.asarray, ot.solve(a, b, Cs[i], reg, max_iter=50, tol=1e-9, trace=True))
    # k binds: both runs end on a kink, where the line search stalls at the
    # rounding level; vmap's rounding differs from a single solve's (~1e-17
    # here), so they may stop (a stalled last iteration records no step) a few
    # iterations apart. Same iterates until then, and each trace ends (NaN)
    # where its own run did.
    n = min(int(out.num_iter[i]), int(single.num_iter)) - 1
    assert n >= 30
    np.testing.assert_allclose(out.trace.value[i][:n], single.trace.value[:n], rtol=1e-10)
    np.testing.assert_array_equal(out.trace.num_evals[i][:n], single.trace.num_evals[:n])
    for res, value in ((out, out.trace.value[i]), (single, single.trace.value)):
      stop = int(res.num_iter[i] if res is out else res.num_iter)
      assert np.isfinite(value[:stop]).all() and np.isnan(value[stop:]).all()


def test_trace_must_be_bool():
  a, b, C = problem(4, 3)
  with pytest.raises(ValueError, match="trace"):
    ot.solve(a, b, C, ot.SquaredL2(1.0), trace=1)
