"""The dropless dispatcher (nn.dropless): a hand loop over tokens and their experts,
the einsum dispatcher at C = S, 8 fake devices against one; shared experts."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import flax.linen as flax_nn

from vmoe_sparse_ot.nn import dropless
from vmoe_sparse_ot.nn.moe import MoeLayer
from vmoe_sparse_ot.nn.routers import ROUTERS, RouterConfig
from vmoe_sparse_ot.nn.routing import Routing

E, K, S = 4, 2, 8


def _layer(dispatcher, router="topk", **options):
  # split_rngs: distinct experts, so that a token sent to the wrong one shows.
  cfg = RouterConfig(router, ROUTERS[router].options(num_selected_experts=K, **options))
  return MoeLayer(num_experts=E, mlp_dim=12, group_size=S, dispatcher=dispatcher, router=cfg,
                  split_rngs=True)


@pytest.fixture(scope="module")
def setup():
  """Tokens (3, 7, 6): 21 tokens -> 3 groups of 8, 3 of them padding; sharp router."""
  x = jax.random.normal(jax.random.key(0), (3, 7, 6))
  params = jax.jit(lambda k: _layer("indices").init(k, x, train=False))(
      jax.random.key(1))["params"]
  params = jax.tree.map(np.asarray, params)
  params["router"]["kernel"] = params["router"]["kernel"] * 20
  return x, params


def _value_and_grad(layer, params, x, *args, with_aux=True, **kwargs):
  def loss(p):
    y, aux, _ = layer.apply({"params": p}, x, *args, **kwargs)
    return jnp.sum(jnp.sin(y)) + (aux if with_aux else 0.0), y
  return jax.jit(jax.value_and_grad(loss, has_aux=True))(params)


def hand_loop(params, x, chosen):
  """y[t] = sum over t's experts j = chosen[t, r] of gate[t, j] * MLP_j(x[t]): each token
  with its own experts' weights (gathered per token), one choice rank at a time."""
  tokens = x.reshape(-1, x.shape[-1])
  ex = params["experts"]
  gates = jax.nn.softmax(tokens @ params["router"]["kernel"], axis=-1)
  t = np.arange(tokens.shape[0])
  y = 0.0
  for r in range(chosen.shape[1]):
    j = chosen[:, r]
    h = jax.nn.gelu(jnp.einsum("td,tdh->th", tokens, ex["wi_kernel"][j]) + ex["wi_bias"][j])
    out = jnp.einsum("th,thd->td", h, ex["wo_kernel"][j]) + ex["wo_bias"][j]
    y = y + gates[t, j][:, None] * out
  return y.reshape(x.shape)


def test_dropless_equals_a_hand_loop_over_tokens_and_their_experts(setup):
  x, params = setup
  (_, y), grads = _value_and_grad(_layer("dropless"), params, x, with_aux=False, train=False)
  logits = np.asarray(x).reshape(-1, x.shape[-1]) @ params["router"]["kernel"]
  chosen = np.argsort(-logits, axis=-1, kind="stable")[:, :K]   # each token's top K

  def loss(p):
    want_y = hand_loop(p, x, chosen)
    return jnp.sum(jnp.sin(want_y)), want_y

  (_, want_y), want = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), grads, want)
  assert np.abs(np.asarray(grads["router"]["kernel"])).max() > 0


def test_dropless_equals_einsum_at_capacity_s_in_training(setup):
  """At C = S the einsum dispatcher drops nothing: same outputs, loss and gradients
  (noisy TopK: the same 'gating' rng draws the same noise)."""
  x, params = setup
  kwargs = dict(train=True, rngs={"gating": jax.random.key(3)})
  (v1, y1), g1 = _value_and_grad(_layer("dropless"), params, x, **kwargs)
  (v2, y2), g2 = _value_and_grad(_layer("einsum", capacity=S), params, x, **kwargs)
  np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(v1, v2, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g1, g2)


def test_sorted_rows_by_hand():
  """Two groups of S=3, E=2: the valid slots, expert-major, numbered across groups."""
  token_index = jnp.array([[[2, 0, 0], [1, 0, 0]], [[0, 1, 0], [0, 0, 0]]], jnp.int32)
  valid = jnp.array([[[1, 0, 0], [1, 0, 0]], [[1, 1, 0], [0, 0, 0]]], bool)
  weight = jnp.where(valid, jnp.arange(12.0).reshape(2, 2, 3) + 1, 0)
  rows = jax.jit(lambda *a: dropless.sorted_rows(Routing(*a, None, None), 3, 6))(
      token_index, valid, weight)
  np.testing.assert_array_equal(rows.token, [2, 3, 4, 1, 0, 0])
  np.testing.assert_array_equal(rows.expert, [0, 0, 0, 1, 2, 2])
  np.testing.assert_array_equal(rows.weight, [1, 7, 8, 4, 0, 0])
  np.testing.assert_array_equal(rows.group_sizes, [3, 1])
  # Blocks of 2 rows: each expert starts a block, its last one padded (weight 0).
  rows = jax.jit(lambda *a: dropless.sorted_rows(Routing(*a, None, None), 3, 6, block=2))(
      token_index, valid, weight)
  np.testing.assert_array_equal(rows.token, [2, 3, 4, 0, 1, 0])
  np.testing.assert_array_equal(rows.expert, [0, 0, 0, 0, 1, 1])
  np.testing.assert_array_equal(rows.weight, [1, 7, 8, 0, 4, 0])
  np.testing.assert_array_equal(rows.group_sizes, [4, 2])


def test_block_products_equal_ragged_dot_values_and_gradients():
  """The CPU's blocked grouped product (hand-written backward) against `ragged_dot`,
  on random slots: blocks of 1 (ragged_dot), 4 and 64 rows."""
  keys = jax.random.split(jax.random.key(0), 6)
  g, s, e, d, h = 3, 16, 4, 6, 10
  valid = jax.random.bernoulli(keys[0], 0.4, (g, e, s))
  routing = Routing(jax.random.randint(keys[1], (g, e, s), 0, s), valid,
                    jnp.where(valid, jax.random.uniform(keys[2], (g, e, s)), 0), None, None)
  x = jax.random.normal(keys[3], (g, s, d))
  params = dropless.ExpertParams(jax.random.normal(keys[4], (e, d, h)), jnp.full((e, h), 0.1),
                                 jax.random.normal(keys[5], (e, h, d)), jnp.full((e, d), 0.2))

  @jax.jit
  def all_blocks(x, params):
    return [jax.value_and_grad(lambda x, p: jnp.sum(jnp.sin(dropless.grouped_mlp(
        x, routing, p, g * e * s, block=b))), argnums=(0, 1))(x, params) for b in (1, 4, 64)]

  want, *got = all_blocks(x, params)
  for other in got:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), other, want)


def test_dropless_refuses_expert_choice_routers_in_one_line():
  layer = _layer("dropless", "expert_choice")
  with pytest.raises(ValueError, match="dispatcher 'dropless' needs a token-choice router, "
                                       "not 'expert_choice'"):
    layer.init(jax.random.key(0), jnp.ones((1, 8, 6)), train=False)


@pytest.mark.parametrize("block", ["ragged_dot", "blocks"])
def test_dropless_on_8_devices_equals_one_device(block, monkeypatch):
  """8 groups over all 8 devices, 8 experts over 'expert' (4): the shard_map path
  (all-gather, per-device grouped product, reduce-scatter) gives the loss and
  gradients of one device, with either grouped product (ragged_dot: GPU and TPU)."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  if block == "ragged_dot":
    monkeypatch.setattr(dropless, "default_block", lambda: 1)
  cfg = RouterConfig("topk", ROUTERS["topk"].options(num_selected_experts=K))
  layer = MoeLayer(num_experts=8, mlp_dim=12, group_size=S, dispatcher="dropless", router=cfg,
                   split_rngs=True)
  x = jax.random.normal(jax.random.key(0), (8, 8, 6))
  params = jax.jit(lambda k: layer.init(k, x, train=False))(jax.random.key(1))["params"]
  want_v, want_g = _value_and_grad(layer, params, x, train=False)
  mesh = jax.make_mesh((2, 4), ("data", "expert"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  param_sh = {"router": {"kernel": NamedSharding(mesh, P())},
              "experts": {k: NamedSharding(mesh, P("expert")) for k in params["experts"]}}
  with jax.set_mesh(mesh):
    p = jax.device_put(params, param_sh)
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    (v, y), g = _value_and_grad(layer, p, xs, train=False)
    hlo = jax.jit(lambda p, x: layer.apply({"params": p}, x, train=False)).lower(
        p, xs).compile().as_text()
  assert "all-gather" in hlo and "reduce-scatter" in hlo
  np.testing.assert_allclose(y, want_v[1], rtol=1e-4, atol=2e-5)
  np.testing.assert_allclose(v, want_v[0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5), g, want_g)


def test_dropless_with_remat_and_bfloat16_follows_einsum_at_capacity_s(setup):
  """bfloat16 tokens, the layer rematerialised: dropless and einsum (C = S) agree to
  bfloat16's precision, gradients included."""
  x, params = setup
  x = x.astype(jnp.bfloat16)
  out = []
  for layer in (_layer("dropless"), _layer("einsum", capacity=S)):
    layer = flax_nn.remat(type(layer), static_argnums=(2,))(**{
        f: getattr(layer, f) for f in ("num_experts", "mlp_dim", "group_size", "dispatcher",
                                       "router", "split_rngs")})
    out.append(_value_and_grad(layer, params, x, False))   # train: static, positional
  ((v1, _), g1), ((v2, _), g2) = out
  np.testing.assert_allclose(np.float32(v1), np.float32(v2), rtol=2e-2)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g2)):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, b, atol=5e-2 * max(np.abs(b).max(), 1e-6))


def test_experts_per_token_marks_the_token_choice_routers():
  """K = min(num_selected_experts, E) for the routers dropless serves, None for the others."""
  got = {name: r.experts_per_token(r.options(num_selected_experts=3), 8)
         for name, r in ROUTERS.items()}
  assert got == {"topk": 3, "sbase": 3, "topk_bias": 3, "sparse_ot": None,
                 "expert_choice": None, "soft_moe": None, "sinkhorn_ec": None,
                 "l2_ot": None, "kl_ot": None}
  token_choice = ROUTERS["sparse_ot"].options(num_selected_experts=3, form="token_choice")
  assert ROUTERS["sparse_ot"].experts_per_token(token_choice, 8) == 3
  assert ROUTERS["topk"].experts_per_token(ROUTERS["topk"].options(num_selected_experts=3), 2) == 2
