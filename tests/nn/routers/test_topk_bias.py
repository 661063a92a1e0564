"""topk_bias (auxiliary-loss-free balancing): the bias picks experts, the gates weigh them."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import router_state
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.moe import MoeLayer
from vmoe_sparse_ot.nn.routers import topk_bias
from tests.nn.helpers import jit_route
from tests.nn.routers.helpers import ALL, LOGITS, cfg, slots
from vmoe_sparse_ot.nn.routing_metrics import common_metrics

# Jitted once per shape and config (eagerly, each op compiles as its own program).
_jit_softmax = jax.jit(jax.nn.softmax)


def _route(bias, logits=LOGITS, mask=ALL, capacity=4, **options):
  c = cfg("topk_bias", **options)
  return jit_route(logits, mask, c, capacity, train=True,
                    state={"bias": np.asarray(bias, np.float32)})


def test_zero_bias_routes_as_topk_without_noise():
  r, stats = _route([0.0, 0.0, 0.0])
  want = jit_route(LOGITS, ALL, cfg("topk", noise_std=0.0), 4, train=True)
  for a, b in zip(r[:3], want[:3]):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # Top-2 per token: t0 {0,1}, t1 {1,2}, t2 {2,0}, t3 {0,2}.
  np.testing.assert_array_equal(stats["load"], [3, 2, 3])
  assert stats["load"].dtype == jnp.int32


def test_bias_changes_the_choice_but_not_the_combine_weights():
  # Expert 0's gate never beats the others' once it is down by 1: every token
  # takes {1, 2}, each weighted by its unbiased softmax gate.
  r, stats = _route([-1.0, 0.0, 0.0])
  assert slots(r) == {0: [], 1: [0, 1, 2, 3], 2: [0, 1, 2, 3]}
  np.testing.assert_array_equal(stats["load"], [0, 4, 4])
  gates = np.asarray(_jit_softmax(LOGITS[0]))
  ti, va, w = (np.asarray(a)[0] for a in (r.token_index, r.valid, r.combine_weight))
  for e in range(3):
    for c in range(4):
      assert w[e, c] == pytest.approx(gates[ti[e, c], e] if va[e, c] else 0.0, rel=1e-6)
  # A small bias only flips close calls: t3's gates for experts 0 and 2 differ by
  # 0.5 in logits; +0.2 on expert 1 does not move t3 (gap 1.5) but takes t2's
  # second choice (expert 0, gate 0.245 vs 0.090 + 0.2).
  r, _ = _route([0.0, 0.2, 0.0])
  assert slots(r) == {0: [0, 3], 1: [0, 1, 2], 2: [1, 2, 3]}
  assert r.combine_weight.shape == (1, 3, 4)


def test_update_rule_by_hand():
  opts = cfg("topk_bias", update_rate=0.1).options
  state = {"bias": np.asarray([0.2, -0.1, 0.0, 0.05], np.float32)}
  load = np.asarray([5, 1, 3, 3], np.int32)           # mean 3: over, under, at, at
  new = jax.jit(routers.ROUTERS["topk_bias"].state.update, static_argnums=0)(
      opts, state, {"load": load})
  np.testing.assert_allclose(new["bias"], [0.1, 0.0, 0.0, 0.05], rtol=1e-6)
  init = routers.ROUTERS["topk_bias"].state.init(opts, 4)
  np.testing.assert_array_equal(init["bias"], np.zeros(4, np.float32))


def test_padding_tokens_do_not_count_and_balance_loss_by_hand():
  mask = np.asarray([[True, True, True, False]])
  r, stats = _route([0.0, 0.0, 0.0], mask=mask, balance_loss_weight=0.5)
  np.testing.assert_array_equal(stats["load"], [2, 2, 2])   # t0 {0,1}, t1 {1,2}, t2 {2,0}
  gates = np.asarray(_jit_softmax(LOGITS[0]))[:3]
  chosen = np.array([[1, 1, 0], [0, 1, 1], [1, 0, 1]], np.float32)
  f = 3 / (2 * 3) * chosen.sum(0)                            # E / (K T) * counts
  p = gates.mean(0)
  np.testing.assert_allclose(r.metrics["balance_loss"], np.sum(f * p), rtol=1e-6)
  np.testing.assert_allclose(r.auxiliary_loss, 0.5 * np.sum(f * p), rtol=1e-6)
  assert float(r.metrics["selected_max_load_violation"]) == 0.0


def test_the_bias_drives_an_unbalanced_router_to_balance():
  """S=64 tokens that all prefer expert 0 (K=1): MaxVio falls as the bias moves."""
  rng = np.random.default_rng(0)
  logits = np.asarray(rng.normal(size=(1, 64, 4)) + [2.0, 0.5, 0.0, 0.0], np.float32)
  mask = np.ones((1, 64), bool)
  c = cfg("topk_bias", num_selected_experts=1, update_rate=0.01)
  spec = routers.ROUTERS["topk_bias"].state

  def step(state, _):
    routing, stats = routers.route(logits, mask, c, 64, True, state=state)
    return spec.update(c.options, state, stats), common_metrics(routing, mask)[
        "max_load_violation"]

  _, maxvio = jax.lax.scan(step, spec.init(c.options, 4), None, length=100)
  maxvio = np.asarray(maxvio)
  assert maxvio[0] > 2.0                       # Nearly every token on expert 0.
  assert maxvio[-10:].max() < 0.3, maxvio[-10:]
  assert np.all(np.diff(maxvio[:20]) <= 0)     # Steady improvement from the start.


def test_moe_layer_keeps_the_bias_in_router_state_and_counts_in_router_stats():
  layer = MoeLayer(num_experts=3, mlp_dim=8, group_size=4, router=cfg("topk_bias"))
  x = np.random.default_rng(1).normal(size=(2, 4, 6)).astype(np.float32)
  variables = jax.jit(lambda k: layer.init(k, x, train=False))(jax.random.key(0))
  params, state = router_state.split(variables)
  np.testing.assert_array_equal(state[router_state.STATE]["bias"], np.zeros(3))
  assert router_state.STATISTICS not in variables

  @jax.jit
  def apply(bias):
    variables = router_state.with_state(params, {router_state.STATE: {"bias": bias}})
    _, out = layer.apply(variables, x, train=True, mutable=[router_state.STATISTICS])
    y, _, metrics = layer.apply(variables, x, train=False)
    return out[router_state.STATISTICS]["load"], y, metrics["bias_range"]

  # Training with 'router_stats' mutable: the counts of the 8 tokens' 2 choices.
  load, y0, _ = apply(np.zeros(3, np.float32))
  assert int(np.sum(load)) == 16
  # Evaluation reads the bias (a large one changes the output) and writes nothing.
  load, y1, bias_range = apply(np.asarray([-5.0, 0.0, 0.0], np.float32))
  np.testing.assert_array_equal(load, [0, 8, 8])
  assert not np.allclose(y0, y1)
  assert float(bias_range) == 5.0


def test_update_rate_must_be_non_negative():
  with pytest.raises(ValueError, match=r"^model.encoder.moe.router.topk_bias.update_rate must "
                     r"be >= 0, got -0.001$"):
    routers.parse_router_options({"name": "topk_bias", "topk_bias": {"update_rate": -1e-3}})
  assert topk_bias.TopKBiasOptions().update_rate == 1e-3
