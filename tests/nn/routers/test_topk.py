"""'topk' (nn/routers/topk.py): assignments, auxiliary losses and noise on small
hand-made logits."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp
from scipy.stats import norm

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.routers import topk
from tests.nn.helpers import jit_common_metrics, jit_route
from tests.nn.routers.helpers import ALL, LOGITS, cfg, cv2, slots, softmax


def test_topk_picks_top_k_and_weights_are_gates():
  r = jit_route(LOGITS, ALL, cfg("topk"), capacity=4, train=False)
  # Top-2 per token: t0 {0,1}, t1 {1,2}, t2 {2,0}, t3 {0,2}.
  assert slots(r) == {0: [0, 2, 3], 1: [0, 1], 2: [1, 2, 3]}
  gates = softmax(LOGITS[0])
  ti, va, w = (np.asarray(a)[0] for a in (r.token_index, r.valid, r.combine_weight))
  for e in range(3):
    for c in range(4):
      assert w[e, c] == pytest.approx(gates[ti[e, c], e] if va[e, c] else 0.0, rel=1e-6)
  # Eval: importance loss only (no noise, so no load loss).
  np.testing.assert_allclose(r.metrics["importance_loss"], cv2(gates.sum(0)), rtol=1e-5)
  assert "load_loss" not in r.metrics
  np.testing.assert_allclose(r.auxiliary_loss, 0.005 * cv2(gates.sum(0)), rtol=1e-5)


def test_topk_auxiliary_losses_are_per_group_means():
  """G = 2 groups, one padding token: CV^2 per group, then the mean over groups."""
  logits = np.array([[[3.0, 1.0, 0.0], [0.0, 2.0, 1.5], [1.0, 0.0, 2.0], [2.5, 0.5, 2.0]],
                     [[0.1, 0.0, 0.2], [0.3, 0.1, 0.0], [0.0, 0.2, 0.1], [9.0, -9.0, 0.0]]],
                    np.float32)
  mask = np.array([[True] * 4, [True, True, True, False]])
  rng = jax.random.key(0)
  opts = cfg("topk", importance_loss_weight=0.5, load_loss_weight=2.0)
  r = jax.jit(lambda x: routers.route(x, jnp.asarray(mask), opts, 4, True, rng))(logits)
  std = 1 / 3                                          # 1/E
  noisy = logits + std * np.asarray(jax.random.normal(rng, logits.shape, jnp.float32))
  gates = softmax(logits)                             # importance: clean gates (V-MoE)
  imp = [cv2(gates[g][mask[g]].sum(0)) for g in range(2)]
  thresh = np.sort(noisy, -1)[..., -2:-1]              # 2nd largest noisy logit
  p = 1 - norm.cdf((thresh - logits) / std)
  load = [cv2(p[g][mask[g]].mean(0)) for g in range(2)]
  np.testing.assert_allclose(r.metrics["importance_loss"], np.mean(imp), rtol=1e-5)
  np.testing.assert_allclose(r.metrics["load_loss"], np.mean(load), rtol=1e-4)
  np.testing.assert_allclose(r.auxiliary_loss, 0.5 * np.mean(imp) + 2.0 * np.mean(load),
                             rtol=1e-4)
  # Pooling the groups (one CV^2 over all tokens) gives a very different value.
  pooled = cv2(np.concatenate([gates[0], gates[1][:3]]).sum(0))
  assert abs(pooled - np.mean(imp)) > 0.1 * np.mean(imp)
  # Combine weights are the noisy gates.
  ti, va, w = map(np.asarray, (r.token_index, r.valid, r.combine_weight))
  noisy_gates = softmax(noisy)
  for g, e, c in zip(*np.nonzero(va)):
    assert w[g, e, c] == pytest.approx(noisy_gates[g, ti[g, e, c], e], rel=1e-5)


def test_topk_eval_never_computes_the_load_term():
  logits = np.tile(LOGITS, (2, 1, 1))
  mask = np.ones((2, 4), bool)
  opts = cfg("topk", noise_std=0.5)

  def ops(train):
    jaxpr = jax.make_jaxpr(lambda x: routers.route(x, mask, opts, 4, train,
                                                   jax.random.key(0)))(logits)
    return str(jaxpr)

  assert "erf" in ops(True)             # the Gaussian CDF of the load loss
  assert "erf" not in ops(False)
  assert not routers.ROUTERS["topk"].needs_rng(opts.options, False)
  assert routers.ROUTERS["topk"].needs_rng(opts.options, True)
  assert not routers.ROUTERS["topk"].needs_rng(cfg("topk", noise_std=0.0).options, True)


def test_topk_capacity_first_choices_first_and_batch_priority():
  # Every token prefers expert 0; capacity 2.
  logits = np.array([[[1.0, 0.0, -1.0], [2.0, 0.5, 0.0], [3.0, 0.0, 1.0], [0.5, 0.4, 0.0]]],
                    np.float32)
  r = jit_route(logits, ALL, cfg("topk"), capacity=2, train=False)
  # Expert 0 takes the first two tokens by position; second choices fill the rest.
  assert slots(r) == {0: [0, 1], 1: [0, 1], 2: [2]}
  m = jit_common_metrics(r, ALL)
  np.testing.assert_allclose(m["dropped_fraction"], 0.25)   # token 3 gets nothing
  np.testing.assert_allclose(m["experts_per_token"], 5 / 4)
  r = jit_route(logits, ALL, cfg("topk", batch_priority=True), capacity=2, train=False)
  # With batch priority, tokens with the largest top gate (2, then 1) go first.
  assert slots(r)[0] == [1, 2]


def test_topk_noise_only_in_training():
  opts = cfg("topk", num_selected_experts=1, noise_std=30.0)   # std 30 / E = 10
  a = jit_route(LOGITS, ALL, opts, 4, train=False, rng=jax.random.key(0))
  b = jit_route(LOGITS, ALL, opts, 4, train=False, rng=jax.random.key(1))
  assert slots(a) == slots(b) == {0: [0, 3], 1: [1], 2: [2]}
  picks = [slots(jit_route(LOGITS, ALL, opts, 4, train=True, rng=jax.random.key(i)))
           for i in range(5)]
  assert any(p != slots(a) for p in picks)



def test_gshard_loss_on_hand_made_gates():
  """E^2 mean_e(f_e m_e): f_e the fraction of tokens whose top gate is e, m_e the mean gate."""
  gates = np.array([[[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.1, 0.1, 0.8], [0.2, 0.5, 0.3]],
                    [[0.3, 0.3, 0.4], [0.5, 0.4, 0.1], [0.9, 0.05, 0.05], [0.0, 0.0, 1.0]]],
                   np.float32)
  mask = np.array([[True] * 4, [True, True, True, False]])
  # Group 0: f = (2, 1, 1)/4, m = (1.6, 1.1, 1.3)/4. Group 1 (3 real tokens): top gates
  # 2, 0, 0: f = (2, 0, 1)/3, m = (1.7, 0.75, 0.55)/3.
  g0 = 9 * np.mean(np.array([2, 1, 1]) / 4 * np.array([1.6, 1.1, 1.3]) / 4)
  g1 = 9 * np.mean(np.array([2, 0, 1]) / 3 * np.array([1.7, 0.75, 0.55]) / 3)
  got = topk.gshard_loss(jnp.asarray(gates), jnp.asarray(mask))
  np.testing.assert_allclose(got, (g0 + g1) / 2, rtol=1e-6)
  # Its gradient flows through the mean gates only: d/dgates[g, s, e] = E^2 f_e / (E S_g) / G.
  grad = np.asarray(jax.grad(lambda x: topk.gshard_loss(x, jnp.asarray(mask)))(jnp.asarray(gates)))
  np.testing.assert_allclose(grad[0, 0], 9 * np.array([2, 1, 1]) / 4 / 3 / 4 / 2, rtol=1e-6)
  np.testing.assert_allclose(grad[1, 3], 0.0)
  # In the router: weighted into the auxiliary loss and reported, on the routing gates.
  opts = cfg("topk", gshard_loss_weight=0.1, importance_loss_weight=0.0)
  r = jit_route(LOGITS, ALL, opts, capacity=4, train=False)
  want = topk.gshard_loss(jnp.asarray(softmax(LOGITS)), jnp.asarray(ALL))
  np.testing.assert_allclose(r.metrics["gshard_loss"], want, rtol=1e-6)
  np.testing.assert_allclose(r.auxiliary_loss, 0.1 * want, rtol=1e-6)
  assert "gshard_loss" not in jit_route(LOGITS, ALL, cfg("topk"), capacity=4,
                                        train=False).metrics
