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
