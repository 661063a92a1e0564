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

from vmoe_sparse_ot.nn import router_state
from vmoe_sparse_ot.nn.model_config import COMPUTE_KEYS, MODEL_DTYPES, MODELS
from vmoe_sparse_ot.nn.model_config import check_model_options, variant_sizes
from vmoe_sparse_ot.nn.dispatch import DISPATCHERS, DTYPES
from vmoe_sparse_ot.nn.routers import ROUTERS, RouterConfig, check_keys, parse_router_options
from vmoe_sparse_ot.nn.routers.base import OptionError
from vmoe_sparse_ot.nn.vit import VisionTransformer, parse_moe_layers

EXPERT_PARAMS_REGEX = r"^(.*/)?moe/experts/[^/]+$"

_MODEL_KEYS = ("name", "variant", "num_classes", "patch_size", "hidden_size", "classifier",
               "representation_size", "head_bias_init", "head_kernel_zero_init", "dtype",
               "remat", "ensemble_size", "encoder")
_ENCODER_KEYS = ("num_layers", "num_heads", "mlp_dim", "dropout_rate",
                 "attention_dropout_rate", "attention_qk_norm", "position_emb", "moe")
_MOE_KEYS = ("layers", "num_experts", "group_size", "dispatcher", "routed_tokens_dtype",
             "split_rngs", "dropout_rate", "router")


def _pair(x) -> tuple:
  return (int(x), int(x)) if isinstance(x, int) else tuple(int(v) for v in x)


def build_model(model_config: Mapping[str, Any]) -> nn.Module:
  """Builds 'vit_moe' or 'vit' from a config like `nn.model_config.default_model_config()`.

  All options are validated here, before anything is traced or compiled.
  """
  cfg = model_config
  check_keys(cfg, _MODEL_KEYS, "model")
  enc = cfg["encoder"]
  check_keys(enc, _ENCODER_KEYS, "model.encoder")
  check_model_options(cfg)
  name = cfg.get("name", "vit_moe")
  classifier = cfg.get("classifier", "token")
  num_layers, num_heads = int(enc["num_layers"]), int(enc["num_heads"])
  hidden_size, mlp_dim = int(cfg["hidden_size"]), int(enc["mlp_dim"])
  patch_size = _pair(cfg["patch_size"])
  rep = cfg.get("representation_size")
  if cfg.get("variant") is not None:
    sizes = variant_sizes(cfg["variant"])
    hidden_size, num_layers = sizes["hidden_size"], sizes["num_layers"]
    num_heads, mlp_dim, patch_size = sizes["num_heads"], sizes["mlp_dim"], sizes["patch_size"]
    if rep is None:
      rep = sizes["representation_size"]
  if rep is not None and int(rep) < 0:
    raise ValueError(f"model.representation_size must be >= 1, 0 (no pre-logits layer) or "
                     f"None, got {rep}")
  dtype = cfg.get("dtype")
  remat = cfg.get("remat", False)
  moe_layers, moe = (), None
  if name == "vit_moe":
    moe_cfg = enc["moe"]
    check_keys(moe_cfg, _MOE_KEYS, "model.encoder.moe")
    dispatcher = moe_cfg.get("dispatcher", "indices")
    if dispatcher not in DISPATCHERS:
      raise ValueError(f"model.encoder.moe.dispatcher must be one of {sorted(DISPATCHERS)}, "
                       f"got {dispatcher!r}")
    routed_dtype = moe_cfg.get("routed_tokens_dtype")
    if routed_dtype is not None and routed_dtype not in DTYPES:
      raise ValueError(f"model.encoder.moe.routed_tokens_dtype must be None or one of "
                       f"{list(DTYPES)}, got {routed_dtype!r}")
    num_experts, group_size = int(moe_cfg["num_experts"]), int(moe_cfg["group_size"])
    if num_experts < 1 or group_size < 1:
      raise ValueError("model.encoder.moe.num_experts and group_size must be >= 1, got "
                       f"{num_experts} and {group_size}")
    moe_layers = parse_moe_layers(moe_cfg.get("layers", "every_2"), num_layers)
    split_rngs = moe_cfg.get("split_rngs", False)
    moe_dropout = moe_cfg.get("dropout_rate")
    if moe_dropout is not None and not (
        isinstance(moe_dropout, (int, float)) and not isinstance(moe_dropout, bool)
        and 0 <= moe_dropout < 1):
      raise ValueError("model.encoder.moe.dropout_rate must be None (the experts use "
                       f"model.encoder.dropout_rate) or in [0, 1), got {moe_dropout!r}")
    router = parse_router_options(moe_cfg["router"])
    try:  # C from S, E and the router's options, checked before anything is traced.
      ROUTERS[router.name].capacity(router.options, group_size, num_experts)
    except ValueError as e:
      text = str(e)
      raise ValueError(text if text.startswith("model.") else
                       f"model.encoder.moe.router.{text}") from None
    moe = dict(num_experts=num_experts, group_size=group_size, dispatcher=dispatcher,
               routed_tokens_dtype=routed_dtype, split_rngs=split_rngs, router=router)
    if moe_dropout is not None:  # Else the experts use encoder.dropout_rate.
      moe["dropout_rate"] = float(moe_dropout)
  num_classes = cfg.get("num_classes", 10)
  return VisionTransformer(
      num_classes=None if num_classes is None else int(num_classes),
      patch_size=patch_size,
      hidden_size=hidden_size,
      num_layers=num_layers,
      num_heads=num_heads,
      mlp_dim=mlp_dim,
      classifier=classifier,
      representation_size=int(rep) if rep else None,
      head_bias_init=float(cfg.get("head_bias_init", 0.0)),
      dropout_rate=float(enc.get("dropout_rate", 0.0)),
      attention_dropout_rate=float(enc.get("attention_dropout_rate", 0.0)),
      moe_layers=moe_layers,
      moe=moe,
      dtype=None if dtype is None else jnp.dtype(dtype),
      remat=remat,
      attention_qk_norm=bool(enc.get("attention_qk_norm", False)),
      position_emb=enc.get("position_emb", "learned"),
      head_kernel_zero_init=bool(cfg.get("head_kernel_zero_init", True)),
      ensemble_size=int(cfg.get("ensemble_size", 1)),
  )


def ensemble_size(model) -> int:
  """M, the E³ members of a built model (1 for a V-MoE or ViT; `nn.ensemble`)."""
  return int(getattr(model, "ensemble_size", 1))


__all__ = ["build_model", "check_model_options", "ensemble_size", "COMPUTE_KEYS", "EXPERT_PARAMS_REGEX", "MODEL_DTYPES", "MODELS", "OptionError", "ROUTERS", "RouterConfig",
           "config", "parse_router_options", "router_state", "VisionTransformer"]
