"""Forward on 8 fake CPU devices with experts sharded over 'expert' == one device, per router."""
import re

import numpy as np
import pytest
import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from vmoe_sparse_ot import nn as vnn
from vmoe_sparse_ot.nn import sharding
from tests.nn.helpers import tiny_config


def _mesh(shape=(4, 2), axis_type=AxisType.Auto):
  return jax.make_mesh(shape, ("data", "expert"), axis_types=(axis_type,) * 2)


def _config(router):
  """router: a router's name, or 'sparse_ot:IMPLEMENTATION'."""
  name, _, implementation = router.partition(":")
  cfg = tiny_config(name, **({"sparse_ot.implementation": implementation}
                             if implementation else {}))
  cfg.encoder.moe.num_experts = 8
  cfg.encoder.moe.group_size = 8           # 16 images x 4 tokens = 8 groups
  return cfg


@pytest.fixture(scope="module")
def inputs():
  """inputs(router) -> (images, params), initialized once per params tree.

  The parameters (tree and values) depend on the router's logits layer only, so
  the routers other than soft_moe share one init (1.7 s of compiling each).
  """
  images = jax.random.normal(jax.random.key(0), (16, 8, 8, 3))
  cache = {}

  def get(router):
    key = router == "soft_moe"
    if key not in cache:
      model = vnn.build_model(_config(router))
      params = jax.jit(lambda k: model.init({"params": k}, images, train=False))(
          jax.random.key(1))["params"]
      params["head"]["kernel"] = jax.random.normal(jax.random.key(2),
                                                   params["head"]["kernel"].shape)
      cache[key] = params
    return images, cache[key]
  return get


@pytest.mark.parametrize("router", [
    "topk", "sbase", "sparse_ot",
    # The fused kernel, split over the devices by hand (nn.sharding.per_shard).
    pytest.param("sparse_ot:pallas", marks=pytest.mark.filterwarnings(
        "ignore:sparse_ot implementation='pallas' on the CPU")),
    "expert_choice", "soft_moe"])
def test_sharded_forward_equals_single_device(router, inputs, mesh_shape=(2, 4)):
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  model = vnn.build_model(_config(router))
  images, params = inputs(router)
  fwd = lambda p, x: model.apply({"params": p}, x, train=False)
  want_logits, want_aux = jax.jit(fwd)(params, images)

  mesh = _mesh(mesh_shape)

  def spec(path, _):
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    return P("expert") if re.search(vnn.EXPERT_PARAMS_REGEX, name) else P()

  param_specs = jax.tree_util.tree_map_with_path(spec, params)
  param_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs)
  n_expert_leaves = sum(s == P("expert") for s in jax.tree.leaves(param_specs))
  assert n_expert_leaves == 4
  with jax.set_mesh(mesh):
    p_sharded = jax.device_put(params, param_sh)
    x_sharded = jax.device_put(images, NamedSharding(mesh, P("data")))
    f = jax.jit(fwd, in_shardings=(param_sh, NamedSharding(mesh, P("data"))))
    # Lowered once: the executable that runs is the one whose HLO is checked.
    compiled = f.lower(p_sharded, x_sharded).compile()
    logits, aux = compiled(p_sharded, x_sharded)
    hlo = compiled.as_text()
  wi = p_sharded["encoder"]["encoderblock_1"]["moe"]["experts"]["wi_kernel"]
  assert wi.addressable_shards[0].data.shape[0] == 8 // mesh_shape[1]
  # Tokens cross between the group layout and the expert layout.
  assert "all-to-all" in hlo or "all-gather" in hlo or "collective-permute" in hlo
  np.testing.assert_allclose(logits, want_logits, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(aux["pre_logits"], want_aux["pre_logits"], rtol=1e-4, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               aux["routing"], want_aux["routing"])


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit], ids=str)
@pytest.mark.parametrize("groups, shard", [(8, 1), (16, 2), (4, 1), (6, 6)],
                         ids=["both-axes", "two-per-device", "data-only", "unsplit"])
def test_per_shard_gives_each_device_its_slice_of_the_groups(groups, shard, axis_type):
  """fn sees the leading size of one device's slice (`shard`) on the (4, 2) mesh:
  8 and 16 groups split over ('data', 'expert'); 4 only over 'data' (8 does not
  divide 4), each 'data' row's two devices holding the same slice; 6 divides by
  neither, so fn runs on all 6, as without a mesh. The arguments come laid out
  otherwise (one replicated, one split over 'data' when it divides); on Explicit
  axes per_shard reshards them."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  x = np.arange(groups * 2, dtype=np.float32).reshape(groups, 2)
  fn = lambda x, y: x * x.shape[0] + y
  np.testing.assert_array_equal(sharding.per_shard(fn, x, x), x * groups + x)   # no mesh
  mesh = _mesh(axis_type=axis_type)
  with jax.set_mesh(mesh):
    y = jax.device_put(x, NamedSharding(mesh, P("data" if groups % 4 == 0 else None)))
    got = jax.jit(lambda x, y: sharding.per_shard(fn, x, y))(jax.device_put(x), y)
  np.testing.assert_array_equal(got, x * shard + x)


def test_per_shard_on_one_device_leaves_the_program_as_it_is():
  """A mesh of size 1 (a single-GPU run) gets fn itself: no shard_map in the program."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  x = np.ones((4, 2), np.float32)
  with jax.set_mesh(_mesh((1, 1))):
    jaxpr = jax.make_jaxpr(lambda x: sharding.per_shard(lambda x: 2 * x, x))(x)
  assert "shard_map" not in str(jaxpr) and "mul" in str(jaxpr)
  with jax.set_mesh(_mesh()):
    assert "shard_map" in str(jax.make_jaxpr(lambda x: sharding.per_shard(lambda x: 2 * x, x))(x))
