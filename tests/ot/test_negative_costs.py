"""Any finite real cost: negative and mixed-sign C solve like C + constant."""
import numpy as np
import pytest

from tests.ot.helpers import pot, problem, quiet
from vmoe_sparse_ot import ot


def _mixed(seed=0, m=10, n=8):
  a, b, C = problem(m, n, seed=seed, uniform=False)
  return a, b, C - 0.6          # entries in [-0.6, 0.4]


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
@pytest.mark.parametrize("shift", [-3.0, 2.5])
def test_plan_invariant_to_cost_shift(formulation, shift):
  a, b, C = _mixed(seed=1)
  assert (C < 0).any() and (C > 0).any()
  reg = ot.SparsityConstrained(k=3, gamma=0.1)
  kw = dict(formulation=formulation, tol=1e-11, max_iter=3000)
  r0 = ot.solve(a, b, C, reg, **kw)
  r1 = ot.solve(a, b, C + shift, reg, **kw)
  # Both runs stop on the kink of the binding k (plans ~0.1, rounding of the
  # shifted cost perturbs the iterates at 1e-16 and the stop by ~1e-8).
  np.testing.assert_allclose(np.asarray(r1.plan), np.asarray(r0.plan), atol=1e-6)
  # Every objective shifts by shift * total mass.
  assert float(r1.value) == pytest.approx(float(r0.value) + shift * b.sum(), abs=1e-9)


def test_all_negative_cost_is_minus_logits_routing():
  """-logits as the cost (the routers' convention) gives C - min(C)'s plan."""
  rng = np.random.RandomState(2)
  C = -np.abs(rng.randn(12, 4)) - 1.0
  a, b = np.full(12, 1 / 12), np.full(4, 1 / 4)
  reg = ot.SparsityConstrained(k=4, gamma=0.5)
  r0 = ot.solve(a, b, C, reg, tol=1e-11, max_iter=3000)
  r1 = ot.solve(a, b, C - C.min(), reg, tol=1e-11, max_iter=3000)
  np.testing.assert_allclose(np.asarray(r0.plan), np.asarray(r1.plan), atol=1e-6)
  assert ((np.asarray(r0.plan) > 0).sum(0) <= 4).all()


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
def test_mixed_sign_agrees_with_pot(formulation):
  a, b, C = _mixed(seed=3)
  gamma, k = 0.1, 3
  fn = (pot().smooth.smooth_ot_semi_dual if formulation == "semi_dual"
        else pot().smooth.smooth_ot_dual)
  G, log = quiet(fn, a, b, C, gamma, reg_type="sparsity_constrained", max_nz=k, log=True,
                 stopThr=1e-12, numItermax=5000)
  pot_value = -float(log["res"].fun)
  res = ot.solve(a, b, C, ot.SparsityConstrained(k=k, gamma=gamma), formulation=formulation,
                 tol=1e-10, max_iter=3000)
  # Both end on a kink, where L-BFGS's line search stalls; where it stalls
  # depends on the path (the semi-dual from alpha = 0 ends 1e-9 above POT's,
  # from the default start 1.9e-7 below). Measured on 40 small binding
  # problems, solves to tol = 1e-10 from either start stop 1e-7 to 1e-4 short
  # on a third of them: 1e-6 is what a kink-bound solve promises here.
  assert float(res.value) >= pot_value - 1e-6 * abs(pot_value)
  assert float(res.value) == pytest.approx(pot_value, rel=1e-5)
  # The plans are set-valued at this optimum (a tie between top-k sets, and the
  # kink leaves the marginals off by ~0.02 for both solvers), so which member
  # each solver lands on depends on rounding: compare sparsity and marginals.
  # Measured on the semi-dual: iterates whose values agree to 1e-10 (or a
  # 1e-9 perturbation of C) land on members whose row violations are 0.013,
  # 0.016 or 0.023; POT's is 0.016. So "of the same size as POT's", not less.
  T = np.asarray(res.plan)
  assert ((T > 0).sum(0) <= k).all()
  for axis, marginal in ((1, a), (0, b)):
    ours = np.abs(T.sum(axis) - marginal).max()
    theirs = np.abs(np.asarray(G).sum(axis) - marginal).max()
    assert ours <= 2 * theirs + 1e-3, (axis, ours, theirs)
  if formulation == "semi_dual":  # its columns hold exactly, kink or not
    np.testing.assert_allclose(T.sum(0), b, atol=1e-12)


def test_mixed_sign_squared_l2_plan_agrees_with_pot():
  a, b, C = _mixed(seed=4)
  G = quiet(pot().smooth.smooth_ot_dual, a, b, C, 0.1, reg_type="l2", stopThr=1e-12,
            numItermax=5000)
  res = ot.solve(a, b, C, ot.SquaredL2(0.1), formulation="dual", tol=1e-10, max_iter=3000)
  np.testing.assert_allclose(np.asarray(res.plan), G, atol=2e-4)
