"""Flax models: ViT / V-MoE with pluggable routers.

Public API (docs/ARCHITECTURE.md):
  build_model(model_config) -> flax.linen.Module
  logits, aux = model.apply({'params': p}, images, train=bool,
                            rngs={'dropout': k1, 'gating': k2})
  (with mutable=['intermediates'], each MoE layer also returns its
  'expert_weights' (G, S, E), see `nn.moe`.)
  A stateful router (topk_bias) adds the collection 'router_state' to the
  variables: apply with `router_state.with_state(params, model_state)`.
  EXPERT_PARAMS_REGEX: matches the '/'-joined paths of expert parameters,
    which carry a leading E axis (shard them over the 'expert' mesh axis).
"""
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp

from vmoe_sparse_ot.nn import model_config
from vmoe_sparse_ot.nn import model_options
from vmoe_sparse_ot.nn import router_state
from vmoe_sparse_ot.nn.model_config import COMPUTE_KEYS
from vmoe_sparse_ot.nn.model_options import MODEL_DTYPES, MODELS, check_model_options
from vmoe_sparse_ot.nn.routers import ROUTERS, RouterConfig, parse_router_options
from vmoe_sparse_ot.nn.routers.base import OptionError
from vmoe_sparse_ot.nn.variants import variant_sizes
from vmoe_sparse_ot.nn.vit import VisionTransformer, parse_moe_layers

EXPERT_PARAMS_REGEX = r"^(.*/)?moe/experts/[^/]+$"


def _pair(x) -> tuple:
  return (int(x), int(x)) if isinstance(x, int) else tuple(int(v) for v in x)


def build_model(model_config: Mapping[str, Any]) -> nn.Module:
  """Builds 'vit_moe' or 'vit' from a config like `nn.model_config.default_model_config()`.

  Every option is checked first (`nn.model_options.model_options`: one-line
  ValueErrors naming the key), before anything is traced or compiled; missing
  keys take the options' defaults.
  """
  opts = model_options.model_options(model_config)
  enc = opts.encoder
  hidden_size, num_layers, num_heads = opts.hidden_size, enc.num_layers, enc.num_heads
  mlp_dim, patch_size, rep = enc.mlp_dim, _pair(opts.patch_size), opts.representation_size
  if opts.variant is not None:
    sizes = variant_sizes(opts.variant)
    hidden_size, num_layers = sizes["hidden_size"], sizes["num_layers"]
    num_heads, mlp_dim, patch_size = sizes["num_heads"], sizes["mlp_dim"], sizes["patch_size"]
    if rep is None:
      rep = sizes["representation_size"]
  moe_layers, moe = (), None
  if opts.name == "vit_moe":
    m = enc.moe
    moe_layers = parse_moe_layers(m.layers, num_layers)
    moe = dict(num_experts=m.num_experts, group_size=m.group_size, dispatcher=m.dispatcher,
               routed_tokens_dtype=m.routed_tokens_dtype, split_rngs=m.split_rngs,
               router=m.router)
    if m.num_shared_experts:
      moe["num_shared_experts"] = m.num_shared_experts
    if m.dropout_rate is not None:  # Else the experts use encoder.dropout_rate.
      moe["dropout_rate"] = m.dropout_rate
    if m.mlp_dim is not None:  # Else the experts are as wide as the dense MLPs.
      moe["mlp_dim"] = m.mlp_dim
  return VisionTransformer(
      num_classes=opts.num_classes,
      patch_size=patch_size,
      hidden_size=hidden_size,
      num_layers=num_layers,
      num_heads=num_heads,
      mlp_dim=mlp_dim,
      classifier=opts.classifier,
      representation_size=int(rep) if rep else None,
      head_bias_init=opts.head_bias_init,
      dropout_rate=enc.dropout_rate,
      attention_dropout_rate=enc.attention_dropout_rate,
      moe_layers=moe_layers,
      moe=moe,
      dtype=None if opts.dtype is None else jnp.dtype(opts.dtype),
      remat=opts.remat,
      attention_qk_norm=enc.attention_qk_norm,
      position_emb=enc.position_emb,
      head_kernel_zero_init=opts.head_kernel_zero_init,
      ensemble_size=opts.ensemble_size,
  )


def ensemble_size(model) -> int:
  """M, the E³ members of a built model (1 for a V-MoE or ViT; `nn.ensemble`)."""
  return int(getattr(model, "ensemble_size", 1))


__all__ = ["build_model", "check_model_options", "ensemble_size", "COMPUTE_KEYS",
           "EXPERT_PARAMS_REGEX", "MODEL_DTYPES", "MODELS", "OptionError", "ROUTERS",
           "RouterConfig", "model_config", "model_options", "parse_router_options",
           "router_state", "VisionTransformer"]
