"""MoE layer against naive loops (TopK, Soft MoE); dispatchers agree; expert_weights."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn.moe import Experts, MoeLayer
from vmoe_sparse_ot.nn.routers import ROUTERS, RouterConfig
from vmoe_sparse_ot.nn.routing import compute_capacity


def _gelu(x):
  """flax.linen.gelu (tanh approximation) in numpy."""
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def cfg(name, **options):
  return RouterConfig(name, ROUTERS[name].options(**options))


def _expert(ex, j, v):
  h = _gelu(v @ np.asarray(ex["wi_kernel"][j]) + np.asarray(ex["wi_bias"][j]))
  return h @ np.asarray(ex["wo_kernel"][j]) + np.asarray(ex["wo_bias"][j])


def _init(layer, x):
  return jax.jit(lambda k: layer.init(k, x, train=False))(jax.random.key(1))["params"]


def naive_moe_topk(x, p, e, k, group_size, capacity):
  """Per-token loop: V-MoE TopK in eval mode (no noise), first choices first.

  Returns y (B, N, D) and the combine weight each token got from each expert (T, E).
  """
  b, n, d = x.shape
  tokens = x.reshape(b * n, d)
  t = tokens.shape[0]
  y = np.zeros_like(tokens)
  weights = np.zeros((t, e), np.float32)
  kernel = np.asarray(p["router"]["kernel"])
  ex = p["experts"]
  for start in range(0, t, group_size):
    idx = list(range(start, min(start + group_size, t)))
    logits = tokens[idx] @ kernel
    gates = np.exp(logits - logits.max(-1, keepdims=True))
    gates /= gates.sum(-1, keepdims=True)
    choices = np.argsort(-gates, axis=-1, kind="stable")[:, :k]
    load = np.zeros(e, int)
    for rank in range(k):
      for row, tok in enumerate(idx):
        j = choices[row, rank]
        if load[j] < capacity:
          load[j] += 1
          y[tok] += gates[row, j] * _expert(ex, j, tokens[tok])
          weights[tok, j] = gates[row, j]
  return y.reshape(b, n, d), weights


@pytest.mark.parametrize("dispatcher", ["indices"])   # einsum == indices: test_dispatch.py
def test_moe_layer_matches_naive_per_token_loop(dispatcher):
  e, k, s = 4, 2, 8
  # split_rngs: distinct experts, so that a token sent to the wrong one shows.
  layer = MoeLayer(num_experts=e, mlp_dim=12, group_size=s, dispatcher=dispatcher,
                   router=cfg("topk", num_selected_experts=k, capacity_factor=0.75),
                   split_rngs=True)
  x = jax.random.normal(jax.random.key(0), (3, 7, 6))   # 21 tokens -> 3 groups, 3 padding
  params = jax.tree.map(np.asarray, _init(layer, x))
  # A larger router scale makes the preferences (and so the capacity drops) sharp.
  params["router"]["kernel"] = params["router"]["kernel"] * 50
  (y, _, metrics), state = jax.jit(lambda p, x: layer.apply(
      {"params": p}, x, train=False, mutable=["intermediates"]))(params, x)
  capacity = compute_capacity(s, e, k, 0.75)
  assert capacity == 4
  want, weights = naive_moe_topk(np.asarray(x), params, e, k, s, capacity)
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
  # Compared as floats: a comparison of jax arrays compiles a program.
  assert float(metrics["dropped_fraction"]) >= 0.0
  assert float(metrics["tokens_per_expert_max"]) <= capacity
  # expert_weights (G, S, E) float32: the combine weight of each (token, expert), 0 when
  # not dispatched (some are: capacity binds) and for the 3 padding tokens.
  (w,) = state["intermediates"]["expert_weights"]
  assert w.shape == (3, s, e) and w.dtype == np.float32
  want_w = np.concatenate([weights, np.zeros((3, e), np.float32)]).reshape(3, s, e)
  np.testing.assert_allclose(w, want_w, rtol=1e-5, atol=1e-7)
  assert (want_w[:, :, :] == 0).sum() > 3 * s * (e - k)


def test_soft_moe_layer_matches_naive_loop():
  """y[t] = sum_{e,c} W[t,e,c] Expert_e(sum_t' D[t',e,c] x[t']) per group, padding masked."""
  e, s = 3, 8
  layer = MoeLayer(num_experts=e, mlp_dim=12, group_size=s, router=cfg("soft_moe", capacity=2),
                   split_rngs=True)
  x = jax.random.normal(jax.random.key(0), (3, 7, 6))   # 21 tokens -> 3 groups, 3 padding
  params = jax.tree.map(np.asarray, _init(layer, x))
  assert params["router"]["mu"].shape == (6, e, 2) and params["router"]["scale"].shape == ()
  params["router"]["scale"] = np.float32(3.0)
  (y, aux, _), state = jax.jit(lambda p, x: layer.apply(
      {"params": p}, x, train=False, mutable=["intermediates"]))(params, x)
  tokens = np.concatenate([np.asarray(x).reshape(21, 6), np.zeros((3, 6), np.float32)])
  unit = lambda v, axis: v / np.sqrt((v ** 2).sum(axis, keepdims=True) + 1e-6)
  mu = unit(params["router"]["mu"], 0)
  want = np.zeros_like(tokens)
  want_w = np.zeros((3, s, e), np.float32)
  for g in range(3):
    xg = tokens[g * s:(g + 1) * s]
    real = np.arange(g * s, (g + 1) * s) < 21
    logits = 3.0 * np.einsum("sd,dec->sec", unit(xg, 1), mu)
    dispatch = np.exp(logits - logits[real].max(0)) * real[:, None, None]
    dispatch /= dispatch.sum(0)
    combine = np.exp(logits - logits.max((1, 2), keepdims=True))
    combine /= combine.sum((1, 2), keepdims=True)
    for ei in range(e):
      for c in range(2):
        out = _expert(params["experts"], ei, dispatch[:, ei, c] @ xg)
        want[g * s:(g + 1) * s][real] += combine[real, ei, c, None] * out
    want_w[g] = combine.sum(-1) * real[:, None]
  np.testing.assert_allclose(y, want[:21].reshape(3, 7, 6), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(state["intermediates"]["expert_weights"][0], want_w, rtol=1e-4,
                             atol=1e-7)
  assert float(aux) == 0.0


@pytest.mark.parametrize("router", ["topk"])
def test_dispatchers_agree_and_capacity_holds(router):
  x = jax.random.normal(jax.random.key(2), (4, 10, 8))
  opts = cfg(router, num_selected_experts=2, capacity_factor=1.0)
  layers = {name: MoeLayer(num_experts=4, mlp_dim=16, group_size=16, dispatcher=name,
                           router=opts, split_rngs=True) for name in ("indices", "einsum")}
  params = _init(layers["indices"], x)       # the parameters do not depend on it

  def f(p, name):
    y, aux, m = layers[name].apply({"params": p}, x, train=True,
                                   rngs={"gating": jax.random.key(3)})
    return jnp.sum(jnp.sin(y)) + aux, (y, m)

  (v1, (y1, m1)), g1 = jax.jit(lambda p: jax.value_and_grad(
      lambda p: f(p, "indices"), has_aux=True)(p))(params)
  (v2, (y2, m2)), g2 = jax.jit(lambda p: jax.value_and_grad(
      lambda p: f(p, "einsum"), has_aux=True)(p))(params)
  np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), g1, g2)
  assert float(m1["tokens_per_expert_max"]) <= compute_capacity(16, 4, 2, 1.0) == 8


def test_experts_initialized_alike_by_default_as_the_reference():
  """split_rngs=False (the reference's default): one draw repeated for every expert."""
  e, d, h = 4, 16, 32
  x = np.ones((e, 3, d), np.float32)
  # One compilation for both, and 'rbg' keys: threefry draws take seconds to compile on CPU.
  alike, split = jax.jit(lambda k: tuple(Experts(e, h, split_rngs=split_rngs).init(
      k, x, train=False)["params"] for split_rngs in (False, True)))(
          jax.random.key(0, impl="rbg"))
  bound = np.sqrt(6 / (d + h))                     # Xavier uniform of one (D, H) kernel
  for name, shape in (("wi_kernel", (e, d, h)), ("wi_bias", (e, h)),
                      ("wo_kernel", (e, h, d)), ("wo_bias", (e, d))):
    a, b = np.asarray(alike[name]), np.asarray(split[name])
    assert a.shape == b.shape == shape
    assert all(np.array_equal(a[0], a[i]) for i in range(1, e)), name
    assert not any(np.array_equal(b[0], b[i]) for i in range(1, e)), name
    assert len(np.unique(a[0])) == a[0].size          # one draw, not a constant
  for p in (alike, split):
    assert np.abs(np.asarray(p["wi_kernel"])).max() <= bound
    assert np.abs(np.asarray(p["wi_kernel"])).max() > 0.9 * bound
  # Dropout: one mask for all experts' buffers when the rngs are not split.
  shared, own = jax.jit(lambda p: tuple(
      Experts(e, h, dropout_rate=0.5, split_rngs=split_rngs).apply(
          {"params": p}, x, train=True, rngs={"dropout": jax.random.key(1, impl="rbg")})
      for split_rngs in (False, True)))(alike)
  shared, own = np.asarray(shared), np.asarray(own)       # numpy: indexing compiles nothing
  assert all(np.array_equal(shared[0], shared[i]) for i in range(1, e))
  assert not np.array_equal(own[0], own[1])
