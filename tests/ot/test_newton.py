"""ot.batched_semi_dual's Newton solver (ot/newton.py) against the optimum and Adam-50.

The optimum of each group is `ot.solve` at its defaults in float64 (it finishes
with the interior point where k binds). The solver's contract at the B/32
routing shapes: a semi-dual gap and a row-mass error no larger than those of the
paper's 50 Adam steps; elsewhere, its stated tolerance.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import newton


def router_problem(g, s, e, k, scale, seed, form="expert_choice", real=None):
  """(C, a, b, k): cost -softmax(scale N(0, 1)), tokens of mass 1, experts of mass
  (real tokens)/E; tokens past `real` are padding (mass 0, cost as the router sets it)."""
  rng = np.random.default_rng(seed)
  logits = scale * rng.standard_normal((g, s, e))
  gates = np.exp(logits - logits.max(-1, keepdims=True))
  cost = -gates / gates.sum(-1, keepdims=True)
  real = s if real is None else real
  a = (np.arange(s) < real).astype(np.float64)[None].repeat(g, 0)
  b = np.full((g, e), real / e)
  if form == "token_choice":
    return np.swapaxes(cost, 1, 2), b, a, k
  return cost, a, b, k


def optimum(C, a, b, k):
  """Each group's semi-dual optimum (float64, rows and columns of mass 0 dropped)."""
  reg = ot.SparsityConstrained(k=k, gamma=1.0)
  out = []
  for g in range(C.shape[0]):
    rows, cols = a[g] > 0, b[g] > 0
    res = ot.solve(jnp.asarray(a[g][rows]), jnp.asarray(b[g][cols]),
                   jnp.asarray(C[g][rows][:, cols]), reg)
    out.append(float(res.value))
  return np.array(out)


def semi_dual(alpha, C, a, b, k):
  reg = ot.SparsityConstrained(k=k, gamma=1.0)
  vals = []
  for g in range(C.shape[0]):
    rows, cols = a[g] > 0, b[g] > 0
    vals.append(float(ot.semi_dual_objective(
        jnp.asarray(alpha[g][rows]), jnp.asarray(a[g][rows]), jnp.asarray(b[g][cols]),
        jnp.asarray(C[g][rows][:, cols]), reg)))
  return np.array(vals)


@functools.partial(jax.jit, static_argnames=("k", "solver", "max_steps", "tol"))
def _solve(C, a, b, k, solver="newton", max_steps=None, tol=newton.DEFAULT_TOL):
  kw = {} if solver == "newton" else {"implementation": "fast"}
  return ot.batched_semi_dual(C, a, b, k, solver=solver, max_steps=max_steps, tol=tol, **kw)


def gap_and_row_error(res, C, a, b, k, opt):
  alpha = np.asarray(res.alpha, np.float64)
  gap = (opt - semi_dual(alpha, C, a, b, k)) / np.abs(opt)
  err = np.abs(np.asarray(res.plan, np.float64).sum(-1) - a).sum(-1) / a.sum(-1)
  return gap, err


# The solver's contract, at the B/32 routing shapes (S = 400, E = 32, k = 28) in
# both logit scales of benchmarks/router_solvers.py, on other seeds than those its
# settings were chosen on: a semi-dual gap and a row-mass error no larger than
# Adam-50's (the means over the groups).
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_newton_matches_adam_50_at_the_b32_routing_shapes(scale):
  C, a, b, k = router_problem(2, 400, 32, 28, scale, seed=21)
  opt = optimum(C, a, b, k)
  args = tuple(jnp.asarray(x) for x in (C, a, b))
  res, adam = _solve(*args, k=k), _solve(*args, k=k, solver="adam", max_steps=50)
  gap, err = gap_and_row_error(res, C, a, b, k, opt)
  adam_gap, adam_err = gap_and_row_error(adam, C, a, b, k, opt)
  assert (np.asarray(res.steps) <= 10).all()
  assert gap.mean() <= adam_gap.mean(), (gap, adam_gap)
  assert err.mean() <= adam_err.mean(), (err, adam_err)


CASES = {
    # name: (G, S, E, k, logit scale, form, real tokens)
    "tiny_config": (3, 64, 8, 16, 2.0, "expert_choice", None),
    "peaked": (3, 96, 8, 16, 4.0, "expert_choice", None),     # E k = 1.33 S
    "ties": (2, 64, 8, 12, 0.0, "expert_choice", None),       # every gate 1/E: all tie
    "padding": (2, 64, 8, 12, 2.0, "expert_choice", 50),
    "k_not_binding": (2, 48, 6, 40, 1.0, "expert_choice", None),
    "k1_infeasible": (2, 30, 6, 1, 2.0, "expert_choice", None),   # E k = 6 < S = 30
    "s_not_multiple_of_e": (2, 70, 8, 14, 2.0, "expert_choice", None),
    "token_choice": (2, 64, 8, 2, 2.0, "token_choice", None),
}
# The stated tolerance (ot/newton.py), against Adam-50 on the same problems: at the
# tiny config's shapes with logits of scale 2, no larger; elsewhere, in 10 steps, a gap at most 2.5x and a
# row-mass error at most 1.35x Adam-50's (measured up to 2.0x and 1.31x on these
# cases), and with max_steps=30 no larger than Adam-50's. Where E k < S (no
# k-sparse plan meets the rows) 10 steps are not enough: 30 are asked there.
GAP_RATIO, ERR_RATIO = 2.5, 1.35
LOOSE = ("peaked", "k1_infeasible", "s_not_multiple_of_e", "token_choice")


@pytest.mark.parametrize("name", list(CASES))
def test_newton_is_within_its_tolerance_of_the_optimum(name):
  g, s, e, k, scale, form, real = CASES[name]
  C, a, b, k = router_problem(g, s, e, k, scale, seed=len(name), form=form, real=real)
  opt = optimum(C, a, b, k)
  args = tuple(jnp.asarray(x) for x in (C, a, b))
  adam_gap, adam_err = gap_and_row_error(_solve(*args, k=k, solver="adam", max_steps=50),
                                         C, a, b, k, opt)
  # 30 steps where 10 fall short of Adam-50 (each cap is one more program).
  for steps in (None, 30) if name in LOOSE else (None,):
    res = _solve(*args, k=k, max_steps=steps)
    gap, err = gap_and_row_error(res, C, a, b, k, opt)
    plan = np.asarray(res.plan)
    assert ((plan > 0).sum(axis=-2) <= k).all()                        # <= k per column
    np.testing.assert_allclose(plan.sum(-2), b, atol=1e-9)             # column masses
    assert (plan[a == 0] == 0).all()                                   # padding: no mass
    assert (np.asarray(res.steps) <= (steps or newton.DEFAULT_MAX_STEPS)).all()
    assert (gap >= -1e-9).all()                                        # never above the optimum
    if steps == 30 or name == "tiny_config":
      gap_ratio, err_ratio = 1.0, 1.0
    elif name == "k1_infeasible":
      continue
    else:
      gap_ratio, err_ratio = GAP_RATIO, ERR_RATIO
    assert gap.mean() <= gap_ratio * adam_gap.mean() + 1e-9, (steps, gap, adam_gap)
    assert err.mean() <= err_ratio * adam_err.mean() + 1e-9, (steps, err, adam_err)


@pytest.mark.float32
def test_float32_gives_float64s_plans():
  C, a, b, k = router_problem(2, 96, 8, 16, 2.0, seed=3)
  with jax.enable_x64(True):
    want = _solve(*(jnp.asarray(x) for x in (C, a, b)), k=k)
    want = np.asarray(want.plan), np.asarray(want.steps)
  got = _solve(*(jnp.asarray(x, jnp.float32) for x in (C, a, b)), k=k)
  assert got.plan.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(got.steps), want[1])
  np.testing.assert_allclose(np.asarray(got.plan), want[0], atol=2e-4)


def test_padding_rows_change_nothing_for_the_real_rows():
  """Rows of mass 0 anywhere in a group, at any cost, leave the real rows' plans as
  they are without them (and get no mass); so do columns of mass 0."""
  C, a, b, k = router_problem(2, 40, 5, 10, 2.0, seed=5)
  want = _solve(*(jnp.asarray(x) for x in (C, a, b)), k=k)
  rng = np.random.default_rng(6)
  pad_rows = np.sort(rng.choice(60, 20, replace=False))
  real_rows = np.setdiff1d(np.arange(60), pad_rows)
  Cp = np.zeros((2, 60, 7))
  Cp[:, real_rows, :5] = C
  Cp[:, pad_rows] = rng.uniform(-1, 0, (2, 20, 7))         # cheaper than real rows
  Cp[:, real_rows, 5:] = -1.0
  ap = np.zeros((2, 60)); ap[:, real_rows] = 1.0
  bp = np.zeros((2, 7)); bp[:, :5] = b
  got = _solve(*(jnp.asarray(x) for x in (Cp, ap, bp)), k=k)
  np.testing.assert_allclose(np.asarray(got.plan)[:, real_rows, :5], np.asarray(want.plan),
                             atol=1e-12)
  assert (np.asarray(got.plan)[:, pad_rows] == 0).all()
  assert (np.asarray(got.plan)[..., 5:] == 0).all()
  np.testing.assert_array_equal(np.asarray(got.steps), np.asarray(want.steps))


def test_steps_count_the_loops_evaluations_and_the_cap_is_reported():
  """Group 0 is solved at alpha = 0 (each expert's k own tokens at cost 0, the rest at
  1: every row gets exactly its mass), so its first evaluation meets the rule: 1
  step, converged. Group 1 is a binding problem and tol = 0, so it runs the cap
  and is reported unconverged; the loop's trip count is the cap."""
  e, k = 4, 5
  s = e * k
  own = np.repeat(np.arange(e), k)
  solved = np.where(np.arange(e)[None] == own[:, None], 0.0, 1.0)
  hard, _, _, _ = router_problem(1, s, e, k, 2.0, seed=7)
  C = np.stack([solved, hard[0]])
  a, b = np.ones((2, s)), np.full((2, e), float(k))
  for cap in (1, 3, 7):
    res = _solve(*(jnp.asarray(x) for x in (C, a, b)), k=k, max_steps=cap, tol=0.0)
    np.testing.assert_array_equal(np.asarray(res.steps), [1, cap])
    np.testing.assert_array_equal(np.asarray(res.converged), [True, False])
  np.testing.assert_allclose(np.asarray(res.plan)[0], (solved == 0).astype(float))


def test_newton_direction_solves_the_damped_system_in_both_layouts():
  """Woodbury (n < m) and the direct m x m solve give the same d as a dense solve of
  (M + diag(damping)) d = grad, M = (D - sum_j 1_Pj 1_Pj^T / n_j) / gamma."""
  rng = np.random.default_rng(8)
  for m, n in ((30, 4), (4, 30)):
    g = 3
    t = rng.uniform(0, 1, (m, n, g)) * (rng.uniform(size=(m, n, g)) < 0.4)
    t[:, 1] = 0                                               # an empty column
    grad, damp = rng.standard_normal((m, g)), rng.uniform(0.5, 2, (m, g))
    d = np.asarray(newton.newton_direction(jnp.asarray(t), jnp.asarray(grad),
                                           jnp.asarray(damp), 0.7))
    for gi in range(g):
      s = (t[:, :, gi] > 0).astype(float)
      size = np.maximum(s.sum(0), 1)
      M = (np.diag(s.sum(1)) - (s / size) @ s.T) / 0.7 + np.diag(damp[:, gi])
      np.testing.assert_allclose(d[:, gi], np.linalg.solve(M, grad[:, gi]), rtol=1e-9)


def test_jit_and_vmap_over_a_batch_of_batches():
  C, a, b, k = router_problem(4, 32, 4, 8, 2.0, seed=9)
  args = [jnp.asarray(x) for x in (C, a, b)]
  one = _solve(*args, k=k)
  two = jax.jit(jax.vmap(lambda c, a, b: ot.batched_semi_dual(c, a, b, k)))(
      *(x.reshape(2, 2, *x.shape[1:]) for x in args))
  np.testing.assert_allclose(np.asarray(two.plan).reshape(np.asarray(one.plan).shape),
                             np.asarray(one.plan), atol=1e-12)
  np.testing.assert_array_equal(np.asarray(two.steps).reshape(-1), np.asarray(one.steps))
