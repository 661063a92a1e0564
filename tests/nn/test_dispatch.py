"""Dispatch / combine against a naive per-slot loop; einsum == indices."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.dispatch import get_dispatcher


def random_routing(rng, g, s, e, c):
  """A random valid routing: each expert takes up to C distinct tokens."""
  token_index = np.zeros((g, e, c), np.int32)
  valid = np.zeros((g, e, c), bool)
  for gi in range(g):
    for ei in range(e):
      n = rng.integers(0, c + 1)
      token_index[gi, ei, :n] = rng.choice(s, size=n, replace=False)
      valid[gi, ei, :n] = True
  weight = rng.uniform(size=(g, e, c)).astype(np.float32) * valid
  return rt.Routing(jnp.asarray(token_index), jnp.asarray(valid), jnp.asarray(weight),
                    jnp.zeros(()), {})


def naive(x, out, r):
  g, e, c = r.token_index.shape
  buf = np.zeros(out.shape, np.float32)
  y = np.zeros(x.shape, np.float32)
  ti, va, w = map(np.asarray, (r.token_index, r.valid, r.combine_weight))
  for gi in range(g):
    for ei in range(e):
      for ci in range(c):
        if va[gi, ei, ci]:
          buf[gi, ei, ci] = x[gi, ti[gi, ei, ci]]
          y[gi, ti[gi, ei, ci]] += w[gi, ei, ci] * out[gi, ei, ci]
  return buf, y


@pytest.mark.parametrize("name", ["indices", "einsum"])
def test_dispatch_combine_match_naive_loop(name):
  rng = np.random.default_rng(1)
  g, s, e, c, d = 2, 10, 3, 4, 5
  x = rng.normal(size=(g, s, d)).astype(np.float32)
  out = rng.normal(size=(g, e, c, d)).astype(np.float32)
  r = random_routing(rng, g, s, e, c)
  dispatch, combine = get_dispatcher(name)
  want_buf, want_y = naive(x, out, r)
  np.testing.assert_allclose(jax.jit(dispatch)(x, r), want_buf, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(jax.jit(combine, static_argnums=2)(out, r, s), want_y,
                             rtol=1e-5, atol=1e-5)


def test_einsum_and_indices_agree_with_gradients():
  rng = np.random.default_rng(2)
  g, s, e, c, d = 2, 12, 4, 4, 6
  x = jnp.asarray(rng.normal(size=(g, s, d)), jnp.float32)
  r = random_routing(rng, g, s, e, c)
  wmat = jnp.asarray(rng.normal(size=(d, d)), jnp.float32)

  def loss(name, x, weight):
    dispatch, combine = get_dispatcher(name)
    rr = r._replace(combine_weight=weight)
    y = combine(jnp.tanh(dispatch(x, rr) @ wmat), rr, s)
    return jnp.sum(y ** 2)

  # Jitted: eagerly, each op of the forward and backward passes compiles on its own.
  vals = {n: jax.jit(jax.value_and_grad(lambda x, w, n=n: loss(n, x, w), argnums=(0, 1)))(
      x, r.combine_weight) for n in ("indices", "einsum")}
  (v1, (gx1, gw1)), (v2, (gx2, gw2)) = vals["indices"], vals["einsum"]
  np.testing.assert_allclose(v1, v2, rtol=1e-5)
  np.testing.assert_allclose(gx1, gx2, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(gw1, gw2, rtol=1e-4, atol=1e-5)
  assert np.abs(gx1).sum() > 0 and np.abs(gw1).sum() > 0


def test_unknown_dispatcher():
  with pytest.raises(ValueError, match="einsum.*indices|indices"):
    get_dispatcher("scatter")
  with pytest.raises(ValueError, match=r"dtype must be None or one of \['float32', 'bfloat16'\]"):
    get_dispatcher("einsum", "float16")


@pytest.mark.parametrize("name", ["indices", "einsum"])
def test_bfloat16_dispatch_rounds_the_data_only_as_the_reference(name):
  """The reference's Bfloat16Dispatcher casts the data, not the routing weights: the
  combine multiplies bfloat16 data by float32 weights and sums in float32."""
  rng = np.random.default_rng(3)
  g, s, e, c, d = 2, 10, 3, 4, 5
  x = rng.normal(size=(g, s, d)).astype(np.float32)
  out = rng.normal(size=(g, e, c, d)).astype(np.float32)
  r = random_routing(rng, g, s, e, c)
  dispatch, combine = get_dispatcher(name, "bfloat16")
  buf, y = jax.jit(dispatch)(x, r), jax.jit(combine, static_argnums=2)(out, r, s)
  assert buf.dtype == y.dtype == jnp.float32
  # The naive loop on bfloat16-rounded data, with the float32 weights, in float32.
  bf = lambda a: np.asarray(a).astype(jnp.bfloat16).astype(np.float32)   # numpy: no compile
  want_buf, _ = naive(bf(x), out, r)
  _, want_y = naive(x, bf(out), r)
  np.testing.assert_array_equal(buf, want_buf)              # a gather: exact
  np.testing.assert_allclose(y, want_y, rtol=1e-6, atol=1e-6)
  f32 = jax.jit(get_dispatcher(name)[1], static_argnums=2)(out, r, s)
  assert not np.array_equal(np.asarray(y), np.asarray(f32))  # its data was rounded


@pytest.mark.parametrize("name", ["indices", "einsum"])
def test_soft_routing_dispatch_and_combine_are_weighted_sums(name):
  rng = np.random.default_rng(4)
  g, s, e, c, d = 2, 6, 3, 2, 4
  x = rng.normal(size=(g, s, d)).astype(np.float32)
  out = rng.normal(size=(g, e, c, d)).astype(np.float32)
  dw = rng.uniform(size=(g, s, e, c)).astype(np.float32)
  cw = rng.uniform(size=(g, s, e, c)).astype(np.float32)
  r = rt.SoftRouting(jnp.asarray(dw), jnp.asarray(cw), jnp.zeros(()), {})
  dispatch, combine = get_dispatcher(name)
  want_buf = np.zeros((g, e, c, d), np.float32)
  want_y = np.zeros((g, s, d), np.float32)
  for gi in range(g):
    for ei in range(e):
      for ci in range(c):
        for si in range(s):
          want_buf[gi, ei, ci] += dw[gi, si, ei, ci] * x[gi, si]
          want_y[gi, si] += cw[gi, si, ei, ci] * out[gi, ei, ci]
  np.testing.assert_allclose(jax.jit(dispatch)(x, r), want_buf, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jit(combine, static_argnums=2)(out, r, s), want_y,
                             rtol=1e-5, atol=1e-6)
  # In bfloat16 (the reference wraps its SoftRouter's dispatcher so): the data is
  # rounded, the float32 weights are not, and both sums run in float32.
  bf = lambda a: np.asarray(a).astype(jnp.bfloat16).astype(np.float32)
  dispatch, combine = get_dispatcher(name, "bfloat16")
  np.testing.assert_allclose(jax.jit(dispatch)(x, r), np.einsum("gsec,gsd->gecd", dw, bf(x)),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jit(combine, static_argnums=2)(out, r, s),
                             np.einsum("gsec,gecd->gsd", cw, bf(out)), rtol=1e-5, atol=1e-6)
