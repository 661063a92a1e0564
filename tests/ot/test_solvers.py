"""`ot.solve` (ot/solvers.py): POT agreement, jit/vmap batches, router-style calls,
stop rules, the finish on kinks, and `semi_dual_loss`."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import pot, problem, quiet, spy
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import interior_point, solvers

TIGHT = dict(tol=1e-10, max_iter=2000)


@pytest.mark.parametrize("reg_type", ["sparsity_constrained", "l2", "kl"])
@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
def test_agrees_with_pot_smooth(reg_type, formulation):
  a, b, C = problem(10, 8, seed=4, uniform=False)
  gamma, k = 0.1, 3
  reg = {"sparsity_constrained": ot.SparsityConstrained(k=k, gamma=gamma),
         "l2": ot.SquaredL2(gamma), "kl": ot.NegEntropy(gamma)}[reg_type]
  kw = {"max_nz": k} if reg_type == "sparsity_constrained" else {}
  fn = (pot().smooth.smooth_ot_semi_dual if formulation == "semi_dual"
        else pot().smooth.smooth_ot_dual)
  G, log = quiet(fn, a, b, C, gamma, reg_type=reg_type, log=True, stopThr=1e-12,
                 numItermax=5000, **kw)
  pot_value = -float(log["res"].fun)
  res = ot.solve(a, b, C, reg, formulation=formulation, **TIGHT)
  assert float(res.value) >= pot_value - 1e-9 * abs(pot_value)  # at least as good
  if reg_type == "sparsity_constrained":
    # Non-smooth (the top-k set changes at the optimum): POT's L-BFGS-B stops a
    # little short; the plan is set-valued at such ties, so compare values only.
    assert float(res.value) == pytest.approx(pot_value, rel=1e-5)
  else:
    assert float(res.value) == pytest.approx(pot_value, rel=1e-6)
    np.testing.assert_allclose(np.asarray(res.plan), G, atol=2e-4)


@pytest.mark.parametrize("solver,formulation", [("lbfgs", "semi_dual"), ("lbfgs", "dual"),
                                                ("adam", "semi_dual")])
def test_vmap_batch_equals_one_by_one(solver, formulation):
  probs = [problem(8, 5, seed=s, uniform=False) for s in range(3)]
  A, B, Cs = (np.stack(x) for x in zip(*probs))
  reg = ot.SparsityConstrained(k=2, gamma=0.3)
  # A fixed iteration budget (tol=0): the batch must follow the same trajectories.
  kw = dict(formulation=formulation, solver=solver, max_iter=15, tol=0.0)
  batched = jax.jit(jax.vmap(lambda a, b, c: ot.solve(a, b, c, reg, **kw)))(A, B, Cs)
  batched = jax.tree_util.tree_map(np.asarray, batched)   # (indexed on the host)
  for i, (a, b, C) in enumerate(probs):
    one = ot.solve(a, b, C, reg, **kw)
    assert int(batched.num_iter[i]) == int(one.num_iter)
    np.testing.assert_allclose(float(batched.value[i]), float(one.value), rtol=1e-9)
    np.testing.assert_allclose(batched.plan[i], np.asarray(one.plan), atol=1e-9)


@pytest.mark.float32
def test_router_call_float32_fixed_iterations_jit_vmap():
  """The router's call: traced a, b, C, static k, tol=0 -> exactly max_iter steps."""
  rng = np.random.RandomState(7)
  logits = rng.randn(3, 16, 4).astype(np.float32)   # (numpy: no eager cast or negation)

  @jax.jit
  def route(lg):
    def one(c):
      a, b = jnp.full((16,), 1 / 16), jnp.full((4,), 1 / 4)
      return ot.solve(a, b, c, ot.SparsityConstrained(k=6, gamma=1.0), formulation="semi_dual",
                      solver=ot.Adam(learning_rate=1e-2), max_iter=50, tol=0.0)
    return jax.vmap(one)(-lg)

  res = route(logits)
  assert res.plan.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(res.num_iter), 50)
  assert np.all((np.asarray(res.plan) > 0).sum(1) <= 6)
  np.testing.assert_allclose(np.asarray(res.plan.sum(1)), 0.25, rtol=1e-5)
  res_l = jax.jit(jax.vmap(lambda c: ot.solve(
      jnp.full((16,), 1 / 16), jnp.full((4,), 1 / 4), c, ot.SparsityConstrained(6, 1.0),
      max_iter=30, tol=0.0)))(-logits)
  assert res_l.plan.dtype == jnp.float32
  assert np.all(np.asarray(res_l.num_iter) <= 30)


def test_warm_start_and_float32_float64():
  a, b, C = problem(8, 6, seed=8)
  reg = ot.SparsityConstrained(k=2, gamma=0.2)
  res = ot.solve(a, b, C, reg, **TIGHT)
  warm = ot.solve(a, b, C, reg, init=res, **TIGHT)
  assert int(warm.num_iter) <= 2
  assert float(warm.value) == pytest.approx(float(res.value), rel=1e-12)
  assert res.plan.dtype == jnp.float64
  r32 = ot.solve(a.astype(np.float32), b.astype(np.float32), C.astype(np.float32), reg,
                 tol=1e-6)
  assert r32.plan.dtype == jnp.float32
  assert float(r32.value) == pytest.approx(float(res.value), rel=1e-5)


def test_lbfgs_stop_rules_rtol_and_ftol_with_patience():
  """rtol (predicted remaining gain) stops early on a smooth problem within the
  precision asked; on a kinked (k binding) one ftol stops far earlier than a tight
  solve, close to its value, and patience=2 goes further than patience=1."""
  a, b, C = problem(40, 30, seed=2, uniform=False)
  a, b, C = map(jnp.asarray, (a, b, C))
  smooth = ot.SquaredL2(0.5)
  ref = ot.solve(a, b, C, smooth, **TIGHT)
  res = ot.solve(a, b, C, smooth, tol=1e-12, max_iter=2000, solver=ot.LBFGS(rtol=1e-8))
  gap = (float(ref.value) - float(res.value)) / abs(float(ref.value))
  assert 0 <= gap <= 1e-6  # within the asked precision (model estimate, 100x margin)
  assert int(res.num_evals) < int(ref.num_evals)
  kinked = ot.SparsityConstrained(k=2, gamma=0.1)
  ref = ot.solve(a, b, C, kinked, tol=1e-12, max_iter=3000, solver=ot.LBFGS(ftol=1e-14))
  res = ot.solve(a, b, C, kinked, tol=1e-12, max_iter=3000,
                 solver=ot.LBFGS(ftol=1e-7, patience=2, rtol=1e-9))
  gap = (float(ref.value) - float(res.value)) / abs(float(ref.value))
  assert -1e-9 <= gap <= 1e-3
  assert 2 * int(res.num_evals) < int(ref.num_evals)
  # patience=1 stops no later than patience=2 (same iterates until the first stop).
  res1 = ot.solve(a, b, C, kinked, tol=1e-12, max_iter=3000,
                  solver=ot.LBFGS(ftol=1e-7, patience=1, rtol=1e-9))
  assert int(res1.num_iter) <= int(res.num_iter)
  assert float(res1.value) <= float(res.value)


def test_other_numeric_options_reuse_the_compiled_solver():
  """Tolerances, budgets and the learning rate are values of one program
  (solvers._solve_program): changing them compiles nothing, and each still
  acts (a budget of 3 stops at 3 iterations; tol = 0 runs the whole budget)."""
  from vmoe_sparse_ot.ot import solvers
  a, b, C = problem(10, 8, seed=7)
  reg = ot.SparsityConstrained(k=3, gamma=0.1)
  ot.solve(a, b, C, reg, solver=ot.LBFGS(rtol=1e-7))
  ot.solve(a, b, C, reg, solver="adam", max_iter=30, tol=0.0)
  compiled = solvers._solve_program._cache_size()
  short = ot.solve(a, b, C, reg, max_iter=3, tol=1e-9)
  tight = ot.solve(a, b, C, reg, solver=ot.LBFGS(rtol=1e-12, ftol=1e-3, patience=2))
  assert (int(short.num_iter), short.reason()) == (3, "max_iter")
  assert int(tight.num_iter) > 3 and tight.reason() in ("objective_tol", "stalled")
  adam = ot.solve(a, b, C, reg, solver=ot.Adam(learning_rate=0.5), max_iter=7, tol=0.0)
  assert (int(adam.num_iter), adam.reason()) == (7, "fixed_iter")
  assert solvers._solve_program._cache_size() == compiled


# A kink-bound problem: L-BFGS stops short; the defaults finish with the
# interior point. Reference optimum from the conic solver Clarabel (see
# tests/ot/test_interior_point.py, which checks the interior point against
# it on a second, non-uniform problem too). The same problem as
# test_interior_point_only_when_asked_or_needed: the two share their
# compiled solvers.
KINK_CASE = (30, 30, 3, 0.5, 0, True)
KINK_VALUE = 0.02142716569366


def test_defaults_reach_the_optimum_of_kink_bound_problems():
  m, n, k, gamma, seed, uniform = KINK_CASE
  a, b, C = problem(m, n, seed=seed, uniform=uniform)
  reg = ot.SparsityConstrained(k, gamma)
  lbfgs = ot.solve(a, b, C, reg, interior_point=False)
  res = ot.solve(a, b, C, reg)
  # L-BFGS alone stops 1.7e-5 short, its rows missing 5% of the mass.
  assert float(lbfgs.value) < KINK_VALUE * (1 - 1e-6)
  assert np.abs(a - np.asarray(lbfgs.plan).sum(1)).sum() > 5e-3 * a.sum()
  # The value certified; its k-sparse plan at the kink is no coupling, and
  # `converged` says so (as does reason(full=True)).
  assert res.reason() == "interior_point" and not bool(res.plan_feasible)
  assert not bool(res.converged) and "value certified" in res.reason(full=True)
  assert float(res.value) == pytest.approx(KINK_VALUE, rel=1e-8)
  assert int(res.num_iter) > int(lbfgs.num_iter)
  # The same result as the interior point called directly.
  direct = ot.solve_interior_point(a, b, C, reg)
  np.testing.assert_allclose(np.asarray(res.alpha), np.asarray(direct.alpha), rtol=0, atol=0)


def test_interior_point_only_when_asked_or_needed(monkeypatch):
  m, n, k, gamma, seed, uniform = KINK_CASE
  a, b, C = problem(m, n, seed=seed, uniform=uniform)
  reg = ot.SparsityConstrained(k, gamma)
  # Past the size limit (m n^2 = 27,000 here) only an explicit True switches.
  monkeypatch.setattr(solvers, "_INTERIOR_POINT_MAX_WORK", 1e4)
  assert ot.solve(a, b, C, reg).reason() == "objective_tol"
  assert ot.solve(a, b, C, reg, interior_point=True).reason() == "interior_point"
  monkeypatch.undo()
  # Tuned stop rules ask for the L-BFGS run as configured; True overrides.
  # (rtol given, at its default value: the same compiled L-BFGS as above.)
  assert ot.solve(a, b, C, reg, solver=ot.LBFGS(rtol=1e-9)).reason() != "interior_point"
  assert ot.solve(a, b, C, reg, solver=ot.LBFGS(rtol=1e-9),
                  interior_point=True).reason() == "interior_point"
  # Under jit the branch cannot depend on values: L-BFGS's point.
  jitted = jax.jit(lambda a, b, C: ot.solve(a, b, C, reg))(a, b, C)
  assert jitted.reason() == "objective_tol"
  # A zero-mass row: the barrier has no interior; L-BFGS's point.
  a0 = np.concatenate([[0.0], a[1:] / a[1:].sum()])
  assert ot.solve(a0, b, C, reg).reason() != "interior_point"
  # k that does not bind: L-BFGS (nearly) meets the marginals, nothing to finish.
  loose = ot.solve(a, b, C, ot.SparsityConstrained(29, 0.5))
  assert loose.reason() in ("converged", "objective_tol")
  assert np.abs(a - np.asarray(loose.plan).sum(1)).sum() < 1e-3 * a.sum()
  with pytest.raises(ValueError, match="interior_point"):
    ot.solve(a, b, C, reg, interior_point="yes")


# n k <= m: k binds for certain. One problem for the two tests below (they
# share the compiled 200-iteration L-BFGS and interior point).
CERTAIN_CASE = (60, 12, 5, 0.1, 2)


def test_certain_kink_finishes_on_a_candidate_support(monkeypatch):
  # n k <= m: the semi-dual's plans have too few nonzeros for the rows, so k
  # binds for certain; L-BFGS only runs its 200 iterations to aim the
  # interior point.
  m, n, k, gamma, seed = CERTAIN_CASE
  a, b, C = problem(m, n, seed=seed, uniform=seed % 2 == 0)
  reg = ot.SparsityConstrained(k, gamma)
  best = ot.solve_interior_point(a, b, C, reg)
  res = ot.solve(a, b, C, reg, trace=True)
  assert res.reason() == "interior_point"
  assert res.trace.value.shape == (solvers._KINK_CERTAIN_MAX_ITER,)
  assert float(res.value) == pytest.approx(float(best.value), rel=1e-9)
  # Past the dense limit (m n^2) but not the candidate one (n^3): the
  # barrier runs on a candidate support grown from L-BFGS's potentials.
  calls = spy(monkeypatch, interior_point, "solve_on_candidates")
  monkeypatch.setattr(solvers, "_DENSE_INTERIOR_POINT_WORK", 0)
  monkeypatch.setattr(solvers, "_INTERIOR_POINT_MAX_WORK", n ** 3)
  res = ot.solve(a, b, C, reg, trace=True)      # (trace: the L-BFGS compiled above)
  assert len(calls) == 1 and res.reason() == "interior_point" and bool(res.converged)
  assert float(res.value) == pytest.approx(float(best.value), rel=1e-9)
  # Past both: L-BFGS alone, with its full budget.
  monkeypatch.setattr(solvers, "_INTERIOR_POINT_MAX_WORK", n ** 3 - 1)
  res = ot.solve(a, b, C, reg, trace=True)
  assert res.reason() != "interior_point" and res.trace.value.shape == (1000,)
  assert len(calls) == 1


def test_certain_kink_resumes_lbfgs_when_the_interior_point_does_not_improve(monkeypatch):
  # The interior point fails (NaN, as from a singular Newton system): L-BFGS
  # goes on from its 200th iterate for the other 800, trace and counts joined.
  m, n, k, gamma, seed = CERTAIN_CASE
  a, b, C = problem(m, n, seed=seed, uniform=seed % 2 == 0)
  reg = ot.SparsityConstrained(k, gamma)

  def failed(a, b, C, reg, *args, **kwargs):
    return SimpleNamespace(value=jnp.asarray(np.nan), converged=jnp.asarray(False))
  monkeypatch.setattr(interior_point, "solve_positive", failed)
  # The two runs joined: L-BFGS's first 200 iterations (the run that aimed the
  # interior point, compiled for the previous test) and the resumed rest.
  chained = spy(monkeypatch, solvers, "_chain")
  res = ot.solve(a, b, C, reg, trace=True)
  assert res.reason() != "interior_point"
  assert res.trace.value.shape == (solvers._DEFAULT_MAX_ITER,)
  assert len(chained) == 1
  first = chained[0][0]
  assert first.trace.value.shape == (solvers._KINK_CERTAIN_MAX_ITER,)
  # The rest is an L-BFGS run from the 200th iterate, called on its own.
  rest = ot.solve(a, b, C, reg, init=first.alpha, trace=True, interior_point=False,
                  max_iter=solvers._DEFAULT_MAX_ITER - solvers._KINK_CERTAIN_MAX_ITER)
  assert int(res.num_iter) == int(first.num_iter) + int(rest.num_iter)
  assert float(res.value) == float(rest.value) and float(res.value) >= float(first.value)
  np.testing.assert_array_equal(np.asarray(res.trace.num_evals[200:]),
                                np.asarray(rest.trace.num_evals) + int(first.num_evals))


def test_danskin_loss_gradients_match_finite_differences():
  """dS/dC = T*, dS/da = alpha* (along mass-preserving directions), no unrolling."""
  a, b, C = problem(6, 4, seed=3, uniform=False)
  reg = ot.SquaredL2(0.5)  # smooth and strictly convex: S is differentiable
  kw = dict(tol=1e-11, max_iter=2000)
  loss = lambda a_, b_, C_: ot.semi_dual_loss(a_, b_, C_, reg, **kw)
  ga, gb, gC = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(a), jnp.asarray(b), jnp.asarray(C))
  res = ot.solve(a, b, C, reg, **kw)
  np.testing.assert_allclose(np.asarray(gC), np.asarray(res.plan), atol=1e-12)
  ga, gb, gC = (np.asarray(g) for g in (ga, gb, gC))   # (products below in numpy)
  h = 1e-5
  rng = np.random.RandomState(4)
  for _ in range(2):
    dC = rng.randn(*C.shape)
    fd = (float(loss(a, b, C + h * dC)) - float(loss(a, b, C - h * dC))) / (2 * h)
    assert float(np.sum(gC * dC)) == pytest.approx(fd, rel=1e-5, abs=1e-9)
    da = rng.randn(6)
    da -= da.mean()  # keep sum(a) = sum(b)
    fd = (float(loss(a + h * da, b, C)) - float(loss(a - h * da, b, C))) / (2 * h)
    assert float(np.dot(ga, da)) == pytest.approx(fd, rel=1e-5, abs=1e-9)
    db = rng.randn(4)
    db -= db.mean()
    fd = (float(loss(a, b + h * db, C)) - float(loss(a, b - h * db, C))) / (2 * h)
    assert float(np.dot(gb, db)) == pytest.approx(fd, rel=1e-5, abs=1e-9)
  # Under jit too, and for the sparsity-constrained regularizer.
  reg_k = ot.SparsityConstrained(k=2, gamma=0.5)
  gC_k = jax.jit(jax.grad(lambda C_: ot.semi_dual_loss(a, b, C_, reg_k, **kw)))(C)
  np.testing.assert_allclose(np.asarray(gC_k), np.asarray(ot.solve(a, b, C, reg_k, **kw).plan),
                             atol=1e-12)
  assert np.all((np.asarray(gC_k) > 0).sum(0) <= 2)
