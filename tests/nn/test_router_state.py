"""nn.router_state: each MoE layer's state updated from its own statistics."""
import jax.numpy as jnp
import numpy as np

from vmoe_sparse_ot.nn import router_state
from vmoe_sparse_ot.nn import routers


def _layer(bias):
  return {"moe": {"bias": jnp.asarray(bias, jnp.float32)}}


def test_update_applies_each_layers_rule_to_its_own_statistics():
  cfg = routers.RouterConfig("topk_bias", routers.ROUTERS["topk_bias"].options(update_rate=0.5))
  state = {router_state.STATE: {"encoder": {"encoderblock_1": _layer([0.0, 0.0]),
                                            "encoderblock_3": _layer([1.0, -1.0]),
                                            "encoderblock_5": _layer([2.0, 2.0])}}}
  stats = {"encoder": {"encoderblock_1": {"moe": {"load": jnp.asarray([3, 1])}},
                       "encoderblock_3": {"moe": {"load": jnp.asarray([0, 4])}}}}
  new = router_state.update(cfg, state, stats)[router_state.STATE]["encoder"]
  np.testing.assert_array_equal(new["encoderblock_1"]["moe"]["bias"], [-0.5, 0.5])
  np.testing.assert_array_equal(new["encoderblock_3"]["moe"]["bias"], [1.5, -1.5])
  # No statistics (the layer did not train): the state as it was.
  np.testing.assert_array_equal(new["encoderblock_5"]["moe"]["bias"], [2.0, 2.0])
  # A model without router state, or without MoE layers, has nothing to update.
  assert router_state.update(cfg, {}, {}) == {}
  assert router_state.update(None, state, stats) == state

