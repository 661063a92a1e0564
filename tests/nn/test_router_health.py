"""The z-loss and router health against their formulas on hand-made logits; empty experts."""
import math

import numpy as np
import jax

from vmoe_sparse_ot.nn import router_health
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.moe import MoeLayer
from vmoe_sparse_ot.nn.routers import ROUTERS, RouterConfig
from tests.nn.helpers import jit_common_metrics

# G = 1 group of S = 3 tokens over E = 2 experts; token 2 is padding (its logits are
# large, so that counting it would show).
LOGITS = np.array([[[math.log(3.0), 0.0], [1.0, 1.0], [50.0, -50.0]]], np.float32)
MASK = np.array([[True, True, False]])
_metrics = jax.jit(lambda x, m: router_health.logit_metrics(x, m)[0])


def test_z_loss_entropy_and_top_prob_by_hand():
  m = _metrics(LOGITS, MASK)
  # Token 0: logsumexp(log 3, 0) = log 4, p = (3/4, 1/4). Token 1: log(2e) = 1 + log 2, p = 1/2.
  np.testing.assert_allclose(m["z_loss"], (math.log(4) ** 2 + (1 + math.log(2)) ** 2) / 2,
                             rtol=1e-6)
  h0 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
  np.testing.assert_allclose(m["router_entropy"], (h0 + math.log(2)) / 2, rtol=1e-6)
  np.testing.assert_allclose(m["router_top_prob"], (0.75 + 0.5) / 2, rtol=1e-6)


def test_slot_logits_sum_their_probabilities_per_expert():
  # Soft MoE's (G, S, E, C) logits: token 0 has slots (0, 0 | log 2, log 4) over E = 2,
  # C = 2: the softmax over all four slots is (1, 1, 2, 4) / 8, so p = (1/4, 3/4).
  logits = np.log(np.array([[[[1.0, 1.0], [2.0, 4.0]]]], np.float32))
  m = _metrics(logits, np.array([[True]]))
  np.testing.assert_allclose(m["z_loss"], math.log(8) ** 2, rtol=1e-6)
  np.testing.assert_allclose(m["router_entropy"],
                             -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), rtol=1e-6)
  np.testing.assert_allclose(m["router_top_prob"], 0.75, rtol=1e-6)


def test_empty_experts_by_hand():
  # E = 4, C = 2, G = 2 groups of S = 3 (token 2 of group 0 is padding). Expert 0 takes
  # tokens in both groups, expert 1 only in group 1; expert 2 holds group 0's padding
  # token alone (it counts as empty); expert 3's slots are all empty.
  token_index = np.array([[[0, 1], [0, 0], [2, 0], [0, 0]],
                          [[0, 0], [2, 0], [0, 0], [0, 0]]])
  valid = np.array([[[True, True], [False, False], [True, False], [False, False]],
                    [[True, False], [True, False], [False, False], [False, False]]])
  routing = rt.Routing(token_index, valid, valid.astype(np.float32), np.float32(0), {})
  mask = np.array([[True, True, False], [True, True, True]])
  assert float(jit_common_metrics(routing, mask)["empty_experts"]) == 2.0


def test_the_layer_adds_the_weighted_z_loss_and_reports_its_health():
  e, s, weight = 4, 8, 0.5
  layers = [MoeLayer(num_experts=e, mlp_dim=8, group_size=s,
                     router=RouterConfig("topk", ROUTERS["topk"].options(z_loss_weight=w)))
            for w in (0.0, weight)]
  x = jax.random.normal(jax.random.key(0), (2, 5, 6))   # 10 tokens: 2 groups, 6 padding
  params = jax.jit(lambda k: layers[0].init(k, x, train=False))(jax.random.key(1))["params"]
  params = jax.tree.map(np.asarray, params)
  params["router"]["kernel"] = params["router"]["kernel"] * 100   # logits of order 1

  @jax.jit
  def run(p):
    outs = [layer.apply({"params": p}, x, train=False) for layer in layers]
    grads = [jax.grad(lambda p, l=layer: l.apply({"params": p}, x, train=False)[1])(p)
             for layer in layers]
    return [o[1:] for o in outs], [g["router"]["kernel"] for g in grads]

  ((aux0, metrics), (aux1, _)), (grad0, grad1) = jax.tree.map(np.asarray, run(params))
  logits = np.asarray(x, np.float64).reshape(10, 6) @ params["router"]["kernel"]
  lse = np.log(np.exp(logits).sum(-1))
  p = np.exp(logits - lse[:, None])
  np.testing.assert_allclose(metrics["z_loss"], np.mean(lse ** 2), rtol=1e-5)
  np.testing.assert_allclose(metrics["router_entropy"], np.mean(-(p * np.log(p)).sum(-1)),
                             rtol=1e-5)
  np.testing.assert_allclose(metrics["router_top_prob"], np.mean(p.max(-1)), rtol=1e-5)
  np.testing.assert_allclose(aux1 - aux0, weight * np.mean(lse ** 2), rtol=1e-5)
  # The z-loss's gradient reaches the router: d/dW of mean(lse^2) = 2 x^T (lse * p) / T.
  want = 2 * np.asarray(x, np.float64).reshape(10, 6).T @ (lse[:, None] * p) / 10
  np.testing.assert_allclose(grad1 - grad0, weight * want, rtol=1e-4, atol=1e-6)
