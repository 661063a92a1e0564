"""'l2_ot' (nn/routers/l2_ot.py): squared-L2 OT routing, its plans against an independent
numpy Adam and against ot.solve with SquaredL2, its dispatch and its implicit gradients."""
import dataclasses

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn.routers import implicit
from vmoe_sparse_ot.nn.routers import l2_ot
from tests.nn.helpers import jit_route
from tests.nn.routers.helpers import cfg, softmax

S, E = 8, 4
LOGITS = np.asarray(jax.random.normal(jax.random.key(0), (2, S, E))) * 2
MASK = np.ones((2, S), bool)
W = np.asarray(jax.random.normal(jax.random.key(1), (2, S, E)))


def numpy_simplex(x, mass):
  """Euclidean projection of x (m,) onto {t >= 0, sum t = mass}, by sorting."""
  u = np.sort(x)[::-1]
  css = np.cumsum(u) - mass
  rho = np.nonzero(u - css / np.arange(1, len(x) + 1) > 0)[0][-1]
  return np.maximum(x - css[rho] / (rho + 1), 0)


def numpy_router_plan(logits, steps, lr, gamma=1.0):
  """The reference's squared-L2 routing written out: Adam (optax's constants) on the
  semi-dual over alpha (S,) from 0, cost -softmax, masses 1 and S/E, in float64."""
  s, e = logits.shape
  cost = -softmax(logits.astype(np.float64))
  b = np.full(e, s / e)

  def plan(alpha):
    return np.stack([b[j] * numpy_simplex((alpha - cost[:, j]) / (gamma * b[j]), 1.0)
                     for j in range(e)], axis=1)

  alpha, m, v = np.zeros(s), np.zeros(s), np.zeros(s)
  for t in range(1, steps + 1):
    g = 1.0 - plan(alpha).sum(1)              # ascent direction of the semi-dual
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    alpha = alpha + lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
  return plan(alpha)


def _plans(opts, logits=LOGITS, mask=MASK):
  return np.asarray(jax.jit(lambda x: l2_ot.plans(x, mask, opts, differentiable=False))(
      logits))


def test_plan_is_the_references_adam_written_out():
  got = _plans(l2_ot.L2OTOptions())                       # 20 steps at 1e-2, as there
  for g in range(2):
    np.testing.assert_allclose(got[g], numpy_router_plan(LOGITS[g], 20, 1e-2), atol=2e-6)


H = 1e-2   # finite-difference step


def _perturbed():
  """(2 + 2 S E, S, E): LOGITS' two groups, then group 0 moved by +-H in each entry."""
  out = [LOGITS[0], LOGITS[1]]
  for i in range(S):
    for j in range(E):
      for sign in (1, -1):
        x = LOGITS[0].copy()
        x[i, j] += sign * H
        out.append(x)
  return np.stack(out)


@pytest.fixture(scope="module")
def exact():
  """ot.solve with SquaredL2 (L-BFGS, tight tolerance) on `_perturbed()`: (plans, alphas)."""
  n = 2 + 2 * S * E
  a, b = np.ones((n, S), np.float32), np.full((n, E), S / E, np.float32)
  res = jax.jit(jax.vmap(lambda a, b, x: ot.solve(a, b, -jax.nn.softmax(x, -1),
                                                  ot.SquaredL2(1.0), tol=1e-7)))(
      a, b, _perturbed())
  return np.asarray(res.plan), np.asarray(res.alpha)


def test_plan_converges_to_ot_solve_with_squared_l2(exact):
  got = _plans(l2_ot.L2OTOptions(num_steps=1500, learning_rate=2e-2))
  paper = _plans(l2_ot.L2OTOptions())
  for g in range(2):
    want = exact[0][g]
    # Adam with a fixed step approaches the optimum slowly: 1500 steps to ~2e-3,
    # where the reference's 20 steps are farther.
    np.testing.assert_allclose(got[g], want, atol=3e-3)
    assert np.abs(paper[g] - want).max() > 4 * np.abs(got[g] - want).max()
    assert np.sum(want == 0) > 0                   # sparse, with no cardinality bound


def test_padding_tokens_get_nothing_and_the_rest_route_alone():
  mask = MASK.copy()
  mask[:, -1] = False
  logits = LOGITS.copy()
  logits[:, -1] = 50.0                                     # whatever padding holds
  opts = l2_ot.L2OTOptions()
  got = _plans(opts, logits, mask)
  alone = _plans(opts, LOGITS[:, :-1], MASK[:, :-1])
  np.testing.assert_allclose(got[:, :-1], alone, atol=1e-6)
  assert np.all(got[:, -1] == 0)


def test_dispatch_takes_the_plans_support_and_combines_as_asked():
  opts = cfg("l2_ot", capacity_factor=1.0, capacity_multiple_of=1)       # C = S/E = 2
  r = jit_route(LOGITS, MASK, opts, capacity=2, train=False)
  plan = _plans(opts.options)
  ti, va, w = (np.asarray(x) for x in (r.token_index, r.valid, r.combine_weight))
  gates = softmax(LOGITS)
  for g in range(2):
    for e in range(E):
      col = plan[g, :, e]
      want = [i for i in np.argsort(-col, kind="stable")[:2] if col[i] > 0]
      assert sorted(ti[g, e][va[g, e]].tolist()) == sorted(want)
      for c in range(2):
        if va[g, e, c]:
          np.testing.assert_allclose(w[g, e, c], gates[g, ti[g, e, c], e], rtol=1e-6)
  by_plan = cfg("l2_ot", capacity_factor=1.0, capacity_multiple_of=1,
                combine_weights="plan", dispatch_zeros=True)
  r = jit_route(LOGITS, MASK, by_plan, capacity=2, train=False)
  ti, va, w = (np.asarray(x) for x in (r.token_index, r.valid, r.combine_weight))
  assert va.all()                                    # dispatch_zeros: every slot is used
  np.testing.assert_allclose(w, np.take_along_axis(plan.transpose(0, 2, 1), ti, 2), atol=1e-7)


def test_implicit_gradient_matches_finite_differences_of_the_exact_plan(exact):
  plans, alphas = exact
  w = W[0]
  values = np.sum(plans[2:] * w, axis=(1, 2)).reshape(S, E, 2)
  fd = (values[..., 0] - values[..., 1]) / (2 * H)
  grad = jax.jit(jax.grad(lambda x, alpha: jnp.sum(implicit.semi_dual_plan(
      alpha, jnp.ones(S), jnp.full(E, S / E), -jax.nn.softmax(x, -1), ot.SquaredL2(1.0)) * w)))
  got = np.asarray(grad(LOGITS[0], alphas[0]))
  np.testing.assert_allclose(got, fd, atol=3e-3)
  assert np.abs(got).max() > 0.05
