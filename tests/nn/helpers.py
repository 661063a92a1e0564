"""Tiny model configs shared by the nn tests."""
import ml_collections

from vmoe_sparse_ot.nn.config import default_model_config


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
