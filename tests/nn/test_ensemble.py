"""E³ ensemble routing (nn/ensemble.py, model.ensemble_size): members keep to their experts."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from vmoe_sparse_ot import nn as vnn
from vmoe_sparse_ot.nn import ensemble, routers, routing_stats
from tests.nn.helpers import tiny_config

B, N, M, E = 8, 4, 2, 4     # images, tokens per image (GAP: no class token), members, experts


def _config(members, experts=E, group_size=8, router="topk"):
  cfg = tiny_config(router, num_selected_experts=1)
  cfg.encoder.moe.num_experts = experts
  cfg.encoder.moe.group_size = group_size
  cfg.ensemble_size = members
  return cfg


def _forward(model):
  def fwd(params, images):
    (logits, aux), state = model.apply({"params": params}, images, mutable=["intermediates"])
    weights = routing_stats.layer_weights(state)["encoderblock_1"]
    return logits, aux["routing"]["encoderblock_1"], weights
  return jax.jit(fwd)


@pytest.fixture(scope="module")
def e3():
  """The E³ model (M=2, E=4, groups of S=8: 8 groups of 4 tokens of each member), its
  parameters with a random head, 8 images, its jitted forward and its outputs."""
  model = vnn.build_model(_config(M))
  images = jax.random.normal(jax.random.key(0), (B, 8, 8, 3))
  # Random parameters of the model's shapes (no init to compile).
  shapes = jax.eval_shape(lambda: model.init({"params": jax.random.key(1)}, images))["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: jnp.asarray(0.3 * rng.normal(size=s.shape), jnp.float32),
                        shapes)
  fwd = _forward(model)
  return model, params, images, fwd, fwd(params, images)


def test_no_token_reaches_another_members_expert_on_8_devices(e3):
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  _, params, images, fwd, (logits, metrics, weights) = e3
  mesh = jax.make_mesh((2, 4), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)
  shard = lambda path, x: NamedSharding(mesh, P("expert") if "experts" in str(path) else P())
  sharded = jax.device_put(params, jax.tree_util.tree_map_with_path(shard, params))
  with jax.set_mesh(mesh):
    got_logits, _, got_weights = fwd(
        sharded, jax.device_put(images, NamedSharding(mesh, P(("data", "expert")))))
  np.testing.assert_allclose(got_logits, logits, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(got_weights) > 0, np.asarray(weights) > 0)
  assert logits.shape == (B * M, 3)
  # (B*M, N, E) in (image, member, token) order; member m owns experts 2m, 2m + 1.
  w = np.asarray(routing_stats.per_image(weights, B * M, N)).reshape(B, M, N, E)
  assert (w[:, 0, :, 2:] == 0).all() and (w[:, 1, :, :2] == 0).all()
  assert (w[:, 0, :, :2] > 0).any() and (w[:, 1, :, 2:] > 0).any()
  assert set(metrics) >= {"member0/dropped_fraction", "member1/experts_per_token"}


def test_each_member_is_the_vmoe_of_its_own_experts(e3):
  """Member m's logits = a V-MoE with E/M experts (m's slice of the experts and of the
  router's columns) and groups of S/M tokens, on the same images."""
  _, params, images, _, (logits, _, _) = e3
  logits = np.asarray(logits).reshape(B, M, 3)
  vmoe = vnn.build_model(_config(1, experts=E // M, group_size=8 // M))
  fwd = jax.jit(lambda p, x: vmoe.apply({"params": p}, x)[0])
  for m in range(M):
    own = jax.tree.map(lambda x: x, params)
    moe = own["encoder"]["encoderblock_1"]["moe"]
    moe["experts"] = jax.tree.map(lambda x, m=m: x[m * 2:(m + 1) * 2], moe["experts"])
    moe["router"]["kernel"] = moe["router"]["kernel"][:, m * 2:(m + 1) * 2]
    np.testing.assert_allclose(logits[:, m], fwd(own, images), rtol=1e-5, atol=1e-6)


def test_one_member_is_the_vmoe_routing():
  """M = 1: the model is the V-MoE's (same module, same outputs), and the ensemble
  wrapper's one problem is the layer's own routing."""
  cfg = _config(1).to_dict()
  del cfg["ensemble_size"]
  assert vnn.build_model(_config(1)) == vnn.build_model(cfg)
  logits = jax.random.normal(jax.random.key(3), (3, 8, E))
  mask = jnp.arange(24).reshape(3, 8) < 21
  opts = routers.parse_router_options(_config(1).encoder.moe.router)
  route = lambda x, k: routers.get_router("topk").route(x, k, opts.options, 4, False, None)
  got, want = jax.jit(lambda x, k: (
      ensemble.full_routing(route(*ensemble.member_problems(x, k, 1)), 1), route(x, k)))(
          logits, mask)
  for a, b in zip(got[:3], want[:3]):
    np.testing.assert_array_equal(a, b)


def test_member_problems_by_hand():
  # One group of S=4 tokens (members 0, 1, 0, 1) over E=4 experts (member 0: 0, 1).
  logits = jnp.arange(16.0).reshape(1, 4, 4)
  mask = jnp.array([[True, True, True, False]])
  sub, sub_mask = ensemble.member_problems(logits, mask, 2)
  np.testing.assert_array_equal(sub, [[[0, 1], [8, 9]], [[6, 7], [14, 15]]])
  np.testing.assert_array_equal(sub_mask, [[True, True], [True, False]])
