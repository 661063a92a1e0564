"""solve() against the paper: weak duality, D = S = P_Psi, limit cases, marginals."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import dual_objective, pot, primal_objective, problem, semi_dual_objective
from vmoe_sparse_ot import ot

TIGHT = dict(tol=1e-10, max_iter=2000)


def feasible_k_sparse_plan(a, b, k):
  """A coupling of a, b whose columns have <= k nonzeros (north-west corner rule on
  a, b with equal size and k >= 2, or a permutation for uniform a, b)."""
  m, n = len(a), len(b)
  T = np.zeros((m, n))
  i, j = 0, 0
  ra, rb = a.copy(), b.copy()
  while i < m and j < n:
    q = min(ra[i], rb[j])
    T[i, j] = q
    ra[i] -= q
    rb[j] -= q
    if ra[i] <= 1e-15:
      i += 1
    else:
      j += 1
  assert np.all((T > 0).sum(0) <= k), "north-west corner plan is not k-sparse"
  return T


def test_weak_duality_pointwise_and_at_the_optimum():
  """D(alpha, beta) <= S(alpha) <= P_Omega(T) for any alpha, beta and any feasible
  k-sparse T (Proposition 1, weak duality), and D* = S* = P_Psi(T*) <= P_Omega(T)."""
  a, b, C = problem(6, 6, seed=1, uniform=False)
  k, gamma = 2, 0.5
  reg = ot.SparsityConstrained(k=k, gamma=gamma)
  T_feas = feasible_k_sparse_plan(a, b, k)
  p_feas = float(np.sum(T_feas * C) + 0.5 * gamma * np.sum(T_feas ** 2))
  rng = np.random.RandomState(0)
  alphas, betas = rng.randn(50, 6) * 0.5, rng.randn(50, 6) * 0.5
  d = jax.jit(jax.vmap(lambda x, y: ot.dual_objective(x, y, a, b, C, reg)))(alphas, betas)
  s = jax.jit(jax.vmap(lambda x: ot.semi_dual_objective(x, a, b, C, reg)))(alphas)
  assert np.all(np.asarray(d) <= np.asarray(s) + 1e-12)
  assert np.all(np.asarray(s) <= p_feas + 1e-12)
  rd = ot.solve(a, b, C, reg, formulation="dual", **TIGHT)
  # Both end on a kink, where L-BFGS stalls a path-dependent 1e-9 to 1e-6 short
  # (here the semi-dual from its default start 4e-7, from alpha = 0 6e-9): the
  # better of two starts stands for the optimum.
  runs = [ot.solve(a, b, C, reg, formulation="semi_dual", init=init, **TIGHT)
          for init in (None, np.zeros(6))]
  rs = max(runs, key=lambda r: float(r.value))
  # D* = S* (Proposition 3, biconjugates), both below any feasible k-sparse plan's cost.
  assert float(rd.value) == pytest.approx(float(rs.value), rel=1e-6)
  assert float(rd.value) == pytest.approx(float(runs[0].value), rel=1e-6)  # default start
  assert float(rs.value) <= p_feas
  # k binds here, so alpha* - c_j has ties at the k-th entry and the plan read off
  # one selection breaks the row marginals (appendix, "dual-primal link"). Resolve
  # the ties as the appendix does -- a convex combination of the tied selections
  # that meets the marginals -- and check S* = P_Psi(T*), Psi computed exactly.
  # At a kink L-BFGS pins alpha* down to ~1e-7 only (runs with different memory
  # sizes or summation orders land 1e-12 apart in value, 3e-7 apart in alpha),
  # which moves the tie-resolved row sums by up to ~1e-5.
  T_star, violation = resolve_ties(np.asarray(rs.alpha), a, b, C, k, gamma)
  assert violation < 1e-5
  np.testing.assert_allclose(T_star.sum(1), a, atol=1e-5)
  np.testing.assert_allclose(T_star.sum(0), b, atol=1e-12)
  assert np.any((T_star > 1e-9).sum(0) > k)  # a genuine convex relaxation
  p_psi = float(primal_objective(jnp.asarray(T_star), C, reg))
  assert p_psi == pytest.approx(float(rs.value), rel=1e-5)


def resolve_ties(alpha, a, b, C, k, gamma, delta=1e-6):
  """T* in U(a, b) from an optimal semi-dual alpha with ties (appendix): per column,
  the candidate plans are the top-k sparsemax of each tie-breaking of the k-th
  entry; an LP finds convex weights whose plan has row sums a (minimising the L1
  violation). Returns (T*, violation)."""
  import itertools
  from scipy.optimize import linprog
  m, n = C.shape
  U = (alpha[:, None] - C) / gamma
  cands, owner = [], []
  for j in range(n):
    u = U[:, j]
    vk = np.sort(u)[::-1][k - 1]
    strict = list(np.nonzero(u > vk + delta)[0])
    ties = list(np.nonzero(np.abs(u - vk) <= delta)[0])
    for comb in itertools.combinations(ties, k - len(strict)):
      S = strict + list(comb)
      t = np.zeros(m)
      t[S] = np_proj_simplex(u[S], b[j])
      cands.append(t)
      owner.append(j)
  P = np.array(cands).T  # (m, #candidates)
  nc = P.shape[1]
  # variables [w (nc), p (m), q (m)]: min sum(p + q), P w + p - q = a, sum_j w = 1.
  A_eq = np.zeros((m + n, nc + 2 * m))
  A_eq[:m, :nc] = P
  A_eq[:m, nc:nc + m] = np.eye(m)
  A_eq[:m, nc + m:] = -np.eye(m)
  for c, j in enumerate(owner):
    A_eq[m + j, c] = 1
  cost = np.concatenate([np.zeros(nc), np.ones(2 * m)])
  res = linprog(cost, A_eq=A_eq, b_eq=np.concatenate([a, np.ones(n)]), bounds=(0, None),
                method="highs")
  w = res.x[:nc]
  T = np.zeros((m, n))
  for c, j in enumerate(owner):
    T[:, j] += w[c] * P[:, c]
  return T, float(res.fun)


def np_proj_simplex(v, b):
  u = np.sort(v)[::-1]
  css = np.cumsum(u) - b
  rho = np.nonzero(u - css / np.arange(1, len(v) + 1) > 0)[0][-1]
  return np.maximum(v - css[rho] / (rho + 1), 0)


def test_k1_limit_is_unregularized_ot_plus_gamma_term():
  """Proposition 4 (limit cases): D = S = S_0 + gamma/2 ||b||^2 = emd value + gamma/2 ||b||^2."""
  # (12 x 6: the size of test_columns_are_k_sparse_and_marginals_hold, whose
  # k = 1 solvers are then compiled once for both.)
  for (m, n), seed in (((12, 6), 0), ((5, 7), 1)):
    a, b, C = problem(m, n, seed=seed, uniform=False)
    gamma = 0.3
    T0, log = pot().emd(a, b, C, log=True)
    expect = float(np.sum(T0 * C)) + 0.5 * gamma * np.sum(b ** 2)
    reg = ot.SparsityConstrained(k=1, gamma=gamma)
    # The maximum is attained at emd's dual potentials (u, v + gamma b).
    u, v = log["u"], log["v"]
    s_u = float(semi_dual_objective(jnp.asarray(u), a, b, C, reg))
    d_uv = float(dual_objective(jnp.asarray(u), jnp.asarray(v + gamma * b), a, b, C, reg))
    assert s_u == pytest.approx(expect, rel=1e-12)
    assert d_uv == pytest.approx(expect, rel=1e-12)
    # The k=1 (semi-)dual is piecewise linear: the solvers approach it from below.
    for formulation in ("semi_dual", "dual"):
      res = ot.solve(a, b, C, reg, formulation=formulation, max_iter=1000, tol=1e-12,
                     solver=ot.LBFGS(ftol=1e-13))
      assert float(res.value) <= expect + 1e-12
      assert float(res.value) == pytest.approx(expect, rel=1e-2)
      assert np.all((np.asarray(res.plan) > 0).sum(0) <= 1)


def test_k_at_least_m_equals_squared_l2():
  a, b, C = problem(6, 8, seed=2)
  r_l2 = ot.solve(a, b, C, ot.SquaredL2(0.2), **TIGHT)
  for k in (6, 10):
    r = ot.solve(a, b, C, ot.SparsityConstrained(k=k, gamma=0.2), **TIGHT)
    np.testing.assert_allclose(float(r.value), float(r_l2.value), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(r.plan), np.asarray(r_l2.plan), atol=1e-12)


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
def test_columns_are_k_sparse_and_marginals_hold(formulation):
  a, b, C = problem(12, 6, seed=3, uniform=False)
  gamma = 0.1
  nnz_l2 = int((np.asarray(ot.solve(a, b, C, ot.SquaredL2(gamma), **TIGHT).plan) > 0)
               .sum(0).max())
  for k in (1, 2, nnz_l2):
    res = ot.solve(a, b, C, ot.SparsityConstrained(k=k, gamma=gamma),
                   formulation=formulation, tol=1e-9, max_iter=3000)
    T = np.asarray(res.plan)
    assert np.all((T > 0).sum(0) <= k)
    assert np.all(T >= 0)
    if formulation == "semi_dual":  # columns lie in b_j * simplex by construction
      np.testing.assert_allclose(T.sum(0), b, atol=1e-14)
    if k == nnz_l2:
      # k cannot bind (the squared-L2 plan is already k-sparse): both marginals
      # hold at the optimum. Where k binds, ties at the optimum can break them.
      np.testing.assert_allclose(T.sum(1), a, atol=5e-8)
      np.testing.assert_allclose(T.sum(0), b, atol=5e-8)
      assert float(res.grad_norm) <= 1e-7
