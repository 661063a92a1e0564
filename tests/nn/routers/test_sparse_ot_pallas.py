"""sparse_ot's implementation='pallas' (the fused kernel, Pallas interpret mode on the
CPU) routes as 'fast' does: the same dispatch and combine weights, and the same
gradients of the routed layer, in both forms, with padding tokens and several groups.
On a mesh of several devices, each device solves its own groups. The kernel's
plans against 'fast': tests/ot/test_pallas_solve.py."""
import re
import warnings

import numpy as np
import pytest
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.routers import ROUTERS, RouterConfig
from vmoe_sparse_ot.nn.routers import sparse_ot


def _config(form, implementation):
  # S = 12 tokens per group, E = 4 experts, 10 Adam steps (interpret mode is slow).
  return RouterConfig("sparse_ot", ROUTERS["sparse_ot"].options(
      form=form, solver="adam", implementation=implementation, num_steps=10,
      k=3 if form == "expert_choice" else None, capacity_factor=1.5))


@pytest.mark.parametrize("form", ["expert_choice", "token_choice"])
def test_pallas_routes_and_differentiates_as_fast(form):
  """The routed layer as the MoE layer computes it (dispatch, experts' outputs
  combined with the combine weights), its loss differentiated to the logits."""
  # 2 groups of 12 tokens, the last 4 padding; token 3 repeats token 0 in each
  # group (equal gates: ties in the plans).
  logits = np.random.default_rng(0).normal(size=(2, 12, 4)).astype(np.float32)
  logits[:, 3] = logits[:, 0]
  mask = np.arange(24).reshape(2, 12) < 20
  values = np.random.default_rng(1).normal(size=(2, 12, 4)).astype(np.float32)

  def run(implementation):
    capacity = ROUTERS["sparse_ot"].capacity(_config(form, implementation).options, 12, 4)

    def loss(x):
      r = routers.route(x, mask, _config(form, implementation), capacity, train=False)
      # y[g, s] = sum over the token's slots of weight * values[g, s, e]: a stand-in
      # for the experts' outputs, so the loss depends on which pairs are dispatched.
      ti, w = r.token_index, r.combine_weight * r.valid               # (G, E, C)
      picked = jnp.take_along_axis(jnp.swapaxes(values, 1, 2), ti, axis=2)
      return jnp.sum(w * picked ** 2) + r.auxiliary_loss, r

    (_, r), grad = jax.value_and_grad(loss, has_aux=True)(logits)
    return r.token_index * r.valid, r.combine_weight, grad

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")            # the interpret-mode warning
    want, got = jax.jit(lambda: (run("fast"), run("pallas")))()
  slots, weights, grad = map(np.asarray, want)
  np.testing.assert_array_equal(got[0], slots)
  np.testing.assert_allclose(got[1], weights, rtol=1e-6)
  np.testing.assert_allclose(got[2], grad, rtol=1e-5, atol=1e-7)
  assert np.abs(grad).sum() > 0 and (grad[1, 8:] == 0).all()   # padding: no gradient


def test_pallas_on_the_cpu_warns_once_and_auto_does_not_pick_it():
  assert sparse_ot.picked_implementation(sparse_ot.SparseOTOptions(k=3, solver="adam"), 12, 4,
                                         backend="cpu") != "pallas"
  opts = sparse_ot.SparseOTOptions(k=3, solver="adam", implementation="pallas", num_steps=1)
  cost = np.zeros((1, 4, 2), np.float32)
  args = cost, np.ones((1, 4), np.float32), np.full((1, 2), 2.0, np.float32)
  sparse_ot._warn_interpret_once.cache_clear()
  with pytest.warns(UserWarning, match="interpret mode"):
    jax.make_jaxpr(lambda *a: sparse_ot._solve(*a, 2, opts))(*args)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    jax.make_jaxpr(lambda *a: sparse_ot._solve(*a, 2, opts))(*args)


@pytest.mark.parametrize("form", ["expert_choice", "token_choice"])
def test_pallas_on_a_mesh_solves_each_devices_groups_on_that_device(form):
  """On 8 devices ('data' 4 x 'expert' 2, the groups split over both, as the MoE
  layer lays them out), each device runs the kernel on its own group: the compiled
  program moves nothing between devices, the plans stay split, and they equal the
  plans of one device, as does the gradient of a routed loss. Without the split, XLA
  gathers all the groups to every device (a Pallas call is one custom call) and
  solves them all there."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  opts = _config(form, "pallas").options
  capacity = ROUTERS["sparse_ot"].capacity(opts, 12, 4)
  logits = np.random.default_rng(2).normal(size=(8, 12, 4)).astype(np.float32)
  mask = np.arange(8 * 12).reshape(8, 12) % 12 < 10                   # 2 padding tokens each
  solve = jax.jit(lambda x, m: sparse_ot.plans(x, m, opts, capacity))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")            # the interpret-mode warning
    want = np.asarray(solve(logits, mask))
    mesh = jax.make_mesh((4, 2), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)
    groups = NamedSharding(mesh, P(("data", "expert")))
    with jax.set_mesh(mesh):
      args = jax.device_put(logits, groups), jax.device_put(mask, groups)
      compiled = solve.lower(*args).compile()
      got = compiled(*args)
  hlo = compiled.as_text()
  assert not re.search(r"all-gather|all-reduce|all-to-all|collective-permute", hlo)
  assert got.sharding.spec == P(("data", "expert"))
  assert got.addressable_shards[0].data.shape == (1, 12, 4)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
  assert (want > 0).any()

  # Training through it: the routed loss's gradient, rematerialized as the trainer's
  # remat lever does, is the one device's.
  def loss(x):
    r = routers.route(x, mask, _config(form, "pallas"), capacity, train=True)
    return jnp.sum(r.combine_weight ** 2) + r.auxiliary_loss

  grad = jax.jit(jax.grad(jax.checkpoint(loss)))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    want_grad = np.asarray(grad(logits))
    with jax.set_mesh(mesh):
      got_grad = grad(jax.device_put(logits, groups))
  np.testing.assert_allclose(np.asarray(got_grad), want_grad, rtol=1e-5, atol=1e-7)
  assert np.abs(want_grad).max() > 0
