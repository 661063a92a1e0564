"""Tiny model configs shared by the nn tests."""
import jax
import ml_collections

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import routing
from vmoe_sparse_ot.nn.model_config import default_model_config
from vmoe_sparse_ot.nn.routing_metrics import common_metrics

# The functions under test, jitted once for every nn test file: called eagerly,
# each jnp op inside compiles as its own XLA program (50-60 per test); jitted,
# one program per shape and config.
jit_route = jax.jit(routers.route, static_argnames=("cfg", "capacity", "train"))
jit_common_metrics = jax.jit(common_metrics)
jit_expert_weights = jax.jit(routing.expert_weights, static_argnames="group_size")


def tiny_config(router: str = "topk", **router_overrides) -> ml_collections.ConfigDict:
  """D=16, 2 blocks (block 1 is MoE), 4 experts, groups of 8 tokens, 8x8 images, GAP."""
  cfg = default_model_config()
  cfg.num_classes = 3
  cfg.patch_size = (4, 4)           # 8x8 images -> 4 patches
  # GAP, so that every token of the last (MoE) block reaches the loss.
  cfg.classifier = "gap"
  cfg.hidden_size = 16
  cfg.encoder.num_layers = 2
  cfg.encoder.num_heads = 2
  cfg.encoder.mlp_dim = 32
  cfg.encoder.moe.num_experts = 4
  cfg.encoder.moe.group_size = 8
  cfg.encoder.moe.router.name = router
  for key, value in router_overrides.items():
    node = cfg.encoder.moe.router
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    node[leaf] = value
  return cfg
