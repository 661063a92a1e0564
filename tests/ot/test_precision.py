"""The half-precision policy (issue 55; `ot.precision`, docs/OT.md): float16
and bfloat16 inputs are computed in float32 by every entry point of `ot`.

Each entry point is called with float16 and bfloat16 inputs and compared
with the same call on those values cast to float32, which must be its
result exactly: the solvers return it in float32, the array maps round it
once to the inputs' dtype.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot import ot

HALF = [jnp.float16, jnp.bfloat16]
RNG = np.random.default_rng(0)
# Masses exact in every dtype, so that the float32 call sees the same problem
# (half-precision masses that differ within their own tolerance fail float32's).
M, N = 8, 4
A = np.full(M, 1 / M)
B = np.full(N, 1 / N)
COST = RNG.uniform(size=(M, N))


def _half_and_float32(dtype, *xs):
  """xs rounded to dtype, and those same values in float32."""
  half = [jnp.asarray(x, dtype) for x in xs]
  return half, [x.astype(jnp.float32) for x in half]


def _assert_same(got, want, dtype):
  """got and want, pytrees, equal leaf by leaf; floating leaves of got in dtype."""
  got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
  assert len(got_leaves) == len(want_leaves)
  for g, w in zip(got_leaves, want_leaves):
    if jnp.issubdtype(w.dtype, jnp.floating):
      assert g.dtype == dtype, (g.dtype, dtype)
    np.testing.assert_array_equal(np.asarray(g, np.float64), np.asarray(w, np.float64))


def test_sinkhorn_in_half_precision_converges_where_bfloat16_arithmetic_did_not():
  """The report: 8 x 5, uniform masses, epsilon 0.1; bfloat16 inputs never
  reached tol = 1e-4 in 2000 iterations (marginals 9e-3 off), computing in
  bfloat16. bfloat16's 1/5 sums to 1.00098 over the 5 columns: accepted
  within bfloat16's tolerance, b matched to sum(a) like `solve` does."""
  cost = RNG.uniform(size=(M, 5))
  ref = ot.sinkhorn(np.float32(A), np.full(5, 0.2, np.float32), np.float32(cost), 0.1, tol=1e-4,
                    max_iter=2000)
  for dtype in HALF:
    a, b, C = (jnp.asarray(x, dtype) for x in (A, np.full(5, 0.2), cost))
    res = ot.sinkhorn(a, b, C, 0.1, tol=1e-4, max_iter=2000)
    assert res.plan.dtype == jnp.float32
    assert bool(res.converged) and int(res.num_iter) < 100
    plan = np.asarray(res.plan, np.float64)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.abs(plan.sum(1) - a64).max() <= 1e-4
    assert np.abs(plan.sum(0) - b64 / b64.sum()).max() <= 1e-4
    # Against the float32 problem before rounding: what rounding C moves.
    assert np.abs(plan - np.asarray(ref.plan)).max() < 2e-3
  (a, b, C), (a32, b32, C32) = _half_and_float32(jnp.bfloat16, A, B, COST)
  _assert_same(ot.sinkhorn(a, b, C, 0.1, tol=1e-4), ot.sinkhorn(a32, b32, C32, 0.1, tol=1e-4),
               jnp.float32)


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.__name__)
def test_solvers_compute_and_return_float32(dtype):
  (a, b, C), (a32, b32, C32) = _half_and_float32(dtype, A, B, COST)
  reg = ot.SparsityConstrained(2, 0.5)
  _assert_same(ot.solve(a, b, C, reg), ot.solve(a32, b32, C32, reg), jnp.float32)
  with pytest.warns(ot.KSparseInfeasibleWarning):   # k = 1: n k = 5 < m = 8
    small = ot.solve_interior_point(a, b, C, ot.SparsityConstrained(1, 0.5), max_newton=60)
  with pytest.warns(ot.KSparseInfeasibleWarning):
    want = ot.solve_interior_point(a32, b32, C32, ot.SparsityConstrained(1, 0.5), max_newton=60)
  _assert_same(small, want, jnp.float32)
  # The batched router solvers: G = 2 problems of 8 x 5 (k = 2 < the
  # candidates' 4 < 8, so they run on candidates).
  Cs = jnp.stack([C, C[::-1]])
  As, Bs = jnp.stack([a, a]), jnp.stack([b, b])
  for solver in (ot.batched_semi_dual_adam, ot.batched_semi_dual_adam_candidates,
                 ot.batched_semi_dual_adam_pallas):
    got = solver(Cs, As, Bs, 2, 0.5, 20, 0.05)
    want = solver(Cs.astype(jnp.float32), As.astype(jnp.float32), Bs.astype(jnp.float32), 2,
                  0.5, 20, 0.05)
    _assert_same(got, want, jnp.float32)
  # The one entry point, both solvers (the Adam paths as above).
  for solver in ("newton", "adam"):
    got = ot.batched_semi_dual(Cs, As, Bs, 2, 0.5, solver=solver, max_steps=6)
    want = ot.batched_semi_dual(Cs.astype(jnp.float32), As.astype(jnp.float32),
                                Bs.astype(jnp.float32), 2, 0.5, solver=solver, max_steps=6)
    _assert_same(got, want, jnp.float32)
  got = ot.batched_semi_dual_newton(Cs, As, Bs, 2, 0.5, max_steps=6)
  want = ot.batched_semi_dual_newton(Cs.astype(jnp.float32), As.astype(jnp.float32),
                                     Bs.astype(jnp.float32), 2, 0.5, max_steps=6)
  _assert_same(got, want, jnp.float32)


@jax.jit
def _maps(x, b, C, a, bm):
  """Every array map on one set of inputs (jitted once per dtype)."""
  regs = (ot.SparsityConstrained(2, 0.5), ot.SquaredL2(0.5), ot.NegEntropy(0.5))
  alpha = x[:, 0]
  out = [ot.projection_simplex(x, b, 0), ot.projection_sparse_simplex(x, 2, b, 0),
         ot.projection_sparse_nonneg(x, 2, 0), ot.projection_nonneg(x),
         ot.simplex_threshold(x, b, 0), ot.top_k(x, 2, 0)[0], ot.top_k_mask(x, 2, 0),
         ot.squared_k_support_norm(x, 2, 0), ot.marginal_errors(jnp.abs(x), a, bm)]
  for reg in regs:
    T = ot.plan_from_semi_dual(alpha, bm, C, reg)
    out += [reg.conj_simplex(x, b, 0), reg.conj_plus(x, 0), reg.primal(jnp.abs(x), 0),
            ot.semi_dual_value_and_grad(alpha, a, bm, C, reg), ot.semi_dual_objective(
                alpha, a, bm, C, reg), ot.dual_value_and_grad(alpha, bm, a, bm, C, reg),
            ot.dual_objective(alpha, bm, a, bm, C, reg), T,
            ot.plan_from_dual(alpha, bm, C, reg), ot.primal_objective(T, C, reg),
            ot.c_transform_start(bm, C, reg)]
  out += [regs[0].conj_simplex_sparse(x, b, 0), regs[0].conj_plus_sparse(x, 0),
          regs[0].nonconvex_value(jnp.abs(x), 0)]
  return out


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.__name__)
def test_array_maps_compute_in_float32_and_return_the_inputs_dtype(dtype):
  x = RNG.normal(size=(M, N))
  half, full = _half_and_float32(dtype, x, B * 3, COST, A, B)
  got = _maps(*half)
  want = jax.tree_util.tree_map(
      lambda y: y.astype(dtype) if jnp.issubdtype(y.dtype, jnp.floating) else y, _maps(*full))
  _assert_same(got, want, dtype)
  # Not the same as computing in half precision: the simplex projection's
  # columns sum to their mass to float32's accuracy before the one rounding.
  t = np.asarray(got[0], np.float64)
  np.testing.assert_allclose(t.sum(0), np.asarray(half[1], np.float64),
                             rtol=2 * float(jnp.finfo(dtype).eps) * M)
