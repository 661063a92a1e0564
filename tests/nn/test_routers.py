"""Each router's assignments on small hand-made logits."""
import dataclasses

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from scipy.stats import norm

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.routers import RouterOptions

ALL = jnp.ones((1, 4), bool)


def _slots(r):
  """{expert: sorted tokens} of group 0."""
  ti, va = np.asarray(r.token_index[0]), np.asarray(r.valid[0])
  return {e: sorted(ti[e][va[e]].tolist()) for e in range(ti.shape[0])}


def _softmax(x):
  x = np.exp(x - x.max(-1, keepdims=True))
  return x / x.sum(-1, keepdims=True)


# S=4 tokens, E=3 experts.
LOGITS = np.array([[[3.0, 1.0, 0.0],
                    [0.0, 2.0, 1.5],
                    [1.0, 0.0, 2.0],
                    [2.5, 0.5, 2.0]]], np.float32)


def test_topk_picks_top_k_and_weights_are_gates():
  opts = RouterOptions(name="topk", num_selected_experts=2)
  r = routers.route(jnp.asarray(LOGITS), ALL, opts, capacity=4, train=False)
  # Top-2 per token: t0 {0,1}, t1 {1,2}, t2 {2,0}, t3 {0,2}.
  assert _slots(r) == {0: [0, 2, 3], 1: [0, 1], 2: [1, 2, 3]}
  gates = _softmax(LOGITS[0])
  ti, va, w = map(np.asarray, (r.token_index[0], r.valid[0], r.combine_weight[0]))
  for e in range(3):
    for c in range(4):
      assert w[e, c] == pytest.approx(gates[ti[e, c], e] if va[e, c] else 0.0, rel=1e-6)
  # Aux losses, hand-computed (V-MoE): CV^2 of importance and of the load probabilities.
  imp = gates.sum(0)
  imp_loss = (imp.std() / imp.mean()) ** 2
  std = 1 / 3
  thresh = np.sort(LOGITS[0], -1)[:, -2:-1]
  p = 1 - norm.cdf((thresh - LOGITS[0]) / std)
  load = p.mean(0)
  load_loss = (load.std() / load.mean()) ** 2
  np.testing.assert_allclose(r.metrics["importance_loss"], imp_loss, rtol=1e-5)
  np.testing.assert_allclose(r.metrics["load_loss"], load_loss, rtol=1e-4)
  np.testing.assert_allclose(r.auxiliary_loss, 0.005 * (imp_loss + load_loss), rtol=1e-4)


def test_topk_capacity_first_choices_first_and_batch_priority():
  # Every token prefers expert 0; capacity 2.
  logits = jnp.array([[[1.0, 0.0, -1.0], [2.0, 0.5, 0.0], [3.0, 0.0, 1.0], [0.5, 0.4, 0.0]]])
  opts = RouterOptions(name="topk", num_selected_experts=2)
  r = routers.route(logits, ALL, opts, capacity=2, train=False)
  # Expert 0 takes the first two tokens by position; second choices fill the rest.
  assert _slots(r) == {0: [0, 1], 1: [0, 1], 2: [2]}
  np.testing.assert_allclose(r.metrics["dropped_fraction"], 0.25)   # token 3 gets nothing
  np.testing.assert_allclose(r.metrics["experts_per_token"], 5 / 4)
  opts = dataclasses.replace(opts, batch_priority=True)
  r = routers.route(logits, ALL, opts, capacity=2, train=False)
  # With batch priority, tokens with the largest top gate (2, then 1) go first.
  assert _slots(r)[0] == [1, 2]


def test_topk_noise_only_in_training():
  opts = RouterOptions(name="topk", num_selected_experts=1, noise_std=10.0)
  logits = jnp.asarray(LOGITS)
  a = routers.route(logits, ALL, opts, 4, train=False, rng=jax.random.key(0))
  b = routers.route(logits, ALL, opts, 4, train=False, rng=jax.random.key(1))
  assert _slots(a) == _slots(b) == {0: [0, 3], 1: [1], 2: [2]}
  picks = [_slots(routers.route(logits, ALL, opts, 4, train=True, rng=jax.random.key(i)))
           for i in range(5)]
  assert any(p != _slots(a) for p in picks)


def test_expert_choice_takes_top_c_tokens_per_expert():
  opts = RouterOptions(name="expert_choice")
  r = routers.route(jnp.asarray(LOGITS), ALL, opts, capacity=2, train=False)
  gates = _softmax(LOGITS[0])
  want = {e: sorted(np.argsort(-gates[:, e], kind="stable")[:2].tolist()) for e in range(3)}
  assert _slots(r) == want
  assert float(r.auxiliary_loss) == 0.0
  # A padding token is never taken.
  mask = jnp.array([[True, True, True, False]])
  r = routers.route(jnp.asarray(LOGITS), mask, opts, capacity=3, train=False)
  assert all(3 not in v for v in _slots(r).values())


def test_unknown_router_and_options():
  with pytest.raises(ValueError, match=r"expert_choice.*sbase.*sparse_ot.*topk"):
    routers.parse_router_options({"name": "hash"})
  with pytest.raises(ValueError, match=r"\['top_k'\].*valid options.*num_selected_experts"):
    routers.parse_router_options({"name": "topk", "top_k": 2})
  with pytest.raises(ValueError, match="adam.*lbfgs"):
    routers.parse_router_options({"name": "sparse_ot", "sparse_ot": {"solver": "sgd"}})
  with pytest.raises(ValueError, match=r"\['iters'\].*epsilon.*num_iters"):
    routers.parse_router_options({"name": "sbase", "sbase": {"iters": 3}})


def _need(name):
  ot = pytest.importorskip("vmoe_sparse_ot.ot")
  if not hasattr(ot, name):
    pytest.skip(f"vmoe_sparse_ot.ot.{name} not available yet")


# All four tokens prefer expert 0; by decreasing margin l0 - l1: 3, 2.5, 0.5, 0.2.
SKEWED = np.array([[[3.0, 0.0], [2.5, 0.0], [1.0, 0.5], [1.2, 1.0]]], np.float32)


def test_sbase_balances_where_topk_does_not():
  _need("sinkhorn")
  logits = jnp.asarray(SKEWED)
  topk = routers.route(logits, ALL, RouterOptions(name="topk", num_selected_experts=1),
                       capacity=4, train=False)
  assert _slots(topk) == {0: [0, 1, 2, 3], 1: []}
  opts = RouterOptions(name="sbase", num_selected_experts=1, sbase_num_iters=50)
  r = routers.route(logits, ALL, opts, capacity=4, train=False)
  # Mass S/E = 2 per expert: the two tokens with the smallest margins move to expert 1
  # (entropic plan: sum_i sigmoid(l_i1 - l_i0 + d) = 2 gives d ~ 1.55).
  assert _slots(r) == {0: [0, 1], 1: [2, 3]}
  gates = _softmax(SKEWED[0])
  np.testing.assert_allclose(r.combine_weight[0, 1, :2], gates[[2, 3], 1], rtol=1e-6)
  np.testing.assert_allclose(r.metrics["experts_per_token"], 1.0)


def test_sparse_ot_expert_choice_takes_column_support():
  _need("solve")
  # k = C = 2 tokens per expert, mass 2 per expert: the top two by margin stay on 0.
  logits = jnp.asarray(np.array([[[3.0, 0.0], [2.0, 0.0], [1.0, 0.0], [0.5, 0.0]]],
                                np.float32))
  r = routers.route(logits, ALL, RouterOptions(name="sparse_ot"), capacity=2, train=False)
  assert _slots(r) == {0: [0, 1], 1: [2, 3]}
  gates = _softmax(np.asarray(logits[0]))
  np.testing.assert_allclose(r.combine_weight[0, 0], gates[np.asarray(r.token_index[0, 0]), 0],
                             rtol=1e-6)


@pytest.mark.parametrize("solver,steps", [("adam", 50), ("lbfgs", 300)])
def test_sparse_ot_plan_columns_sparse_marginals_and_support(solver, steps):
  _need("solve")
  g, s, e, c = 2, 16, 4, 6
  logits = jax.random.normal(jax.random.key(0), (g, s, e)) * 2
  opts = RouterOptions(name="sparse_ot", sparse_ot_solver=solver, sparse_ot_num_steps=steps)
  mask = jnp.ones((g, s), bool)
  # One jit, so XLA computes the plan once for both outputs.
  r, plans = jax.jit(lambda x: (routers.route(x, mask, opts, c, False),
                                routers.sparse_ot_plans(x, mask, opts, c)))(logits)
  plans = np.asarray(plans)
  cost = 1.0 - jax.nn.softmax(logits, -1)
  b = jnp.full((e,), s / e)
  assert ((plans > 0).sum(axis=1) <= c).all()                 # <= k nonzeros per column
  np.testing.assert_allclose(plans.sum(axis=1), s / e, rtol=1e-5)   # column marginals
  # Row marginals (mass 1 per token) only hold approximately: the sparsity-
  # constrained semi-dual is not exact in general. The solver must still improve
  # them clearly over the plan at alpha = 0 (each column's top-k by gate).
  from vmoe_sparse_ot import ot
  reg = ot.SparsityConstrained(k=c, gamma=1.0)
  init = np.stack([np.asarray(ot.plan_from_semi_dual(jnp.zeros((s,)), b, cc, reg))
                   for cc in cost])
  row_err, init_err = (np.abs(p.sum(axis=2) - 1).mean() for p in (plans, init))
  assert row_err < 0.15 and row_err < 0.6 * init_err, (row_err, init_err)
  ti, va = np.asarray(r.token_index), np.asarray(r.valid)
  for gi in range(g):
    for ei in range(e):
      assert set(ti[gi, ei][va[gi, ei]]) == set(np.nonzero(plans[gi, :, ei])[0])


def test_sparse_ot_token_choice_at_most_k_experts_per_token():
  _need("solve")
  logits = jax.random.normal(jax.random.key(1), (2, 12, 4)) * 2
  opts = RouterOptions(name="sparse_ot", num_selected_experts=1,
                       sparse_ot_form="token_choice", sparse_ot_solver="lbfgs",
                       sparse_ot_num_steps=300)
  r = jax.jit(lambda x: routers.route(x, jnp.ones((2, 12), bool), opts, 12, False))(logits)
  per_token = np.zeros((2, 12), int)
  for gi in range(2):
    for t in np.asarray(r.token_index[gi])[np.asarray(r.valid[gi])]:
      per_token[gi, t] += 1
  assert (per_token == 1).all()          # K = 1 expert each, no capacity binding (C = S)
  # Balanced: mass S/E = 3 per expert and one expert per token give 3 tokens each.
  np.testing.assert_array_equal(np.asarray(r.valid).sum(-1), 3)
