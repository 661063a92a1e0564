"""MoE layer against a naive per-token loop; dispatchers agree at layer level."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn.moe import MoeLayer
from vmoe_sparse_ot.nn.routers import RouterOptions
from vmoe_sparse_ot.nn.routing import compute_capacity


def _gelu(x):
  """flax.linen.gelu (tanh approximation) in numpy."""
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _init(layer, x):
  return jax.jit(lambda k: layer.init(k, x, train=False))(jax.random.key(1))["params"]


def naive_moe_topk(x, p, e, k, group_size, capacity):
  """Per-token loop: V-MoE TopK in eval mode (no noise), first choices first."""
  b, n, d = x.shape
  tokens = x.reshape(b * n, d)
  t = tokens.shape[0]
  y = np.zeros_like(tokens)
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
          h = _gelu(tokens[tok] @ np.asarray(ex["wi_kernel"][j]) + np.asarray(ex["wi_bias"][j]))
          out = h @ np.asarray(ex["wo_kernel"][j]) + np.asarray(ex["wo_bias"][j])
          y[tok] += gates[row, j] * out
  return y.reshape(b, n, d)


@pytest.mark.parametrize("dispatcher", ["indices"])   # einsum == indices: test_dispatch.py
def test_moe_layer_matches_naive_per_token_loop(dispatcher):
  e, k, s = 4, 2, 8
  layer = MoeLayer(num_experts=e, mlp_dim=12, group_size=s, dispatcher=dispatcher,
                   router=RouterOptions(name="topk", num_selected_experts=k,
                                        capacity_factor=0.75))
  x = jax.random.normal(jax.random.key(0), (3, 7, 6))   # 21 tokens -> 3 groups, 3 padding
  params = jax.tree.map(np.asarray, _init(layer, x))
  # A larger router scale makes the preferences (and so the capacity drops) sharp.
  params["router"]["kernel"] = params["router"]["kernel"] * 50
  y, _, metrics = jax.jit(lambda p, x: layer.apply({"params": p}, x, train=False))(params, x)
  capacity = compute_capacity(s, e, k, 0.75)
  assert capacity == 4
  want = naive_moe_topk(np.asarray(x), params, e, k, s, capacity)
  np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
  assert metrics["dropped_fraction"] >= 0.0 and metrics["tokens_per_expert_max"] <= capacity


@pytest.mark.parametrize("router", ["topk"])
def test_dispatchers_agree_and_capacity_holds(router):
  x = jax.random.normal(jax.random.key(2), (4, 10, 8))
  opts = RouterOptions(name=router, num_selected_experts=2, capacity_factor=1.0)
  layers = {name: MoeLayer(num_experts=4, mlp_dim=16, group_size=16, dispatcher=name,
                           router=opts) for name in ("indices", "einsum")}
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
  assert m1["tokens_per_expert_max"] <= compute_capacity(16, 4, 2, 1.0) == 8
