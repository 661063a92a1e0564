"""Vision Transformer encoder whose MLP blocks can be sparse MoE layers.

Pre-LayerNorm blocks (Dosovitskiy et al. 2021), as in V-MoE (Riquelme et al.
2021): patch embedding, optional class token, position embeddings, blocks of
multi-head self-attention and MLP (or MoE), final LayerNorm, pooling, optional
tanh representation layer, linear head. The options of the reference code's
Soft MoE recipe (Puigcerver et al. 2024) are here too, each off by default:
- `attention_qk_norm`: LayerNorm (scale, no bias, over each head's features) on
  the queries and keys before their dot product (flax's `normalize_qk`, as the
  reference); the parameters `query_ln/scale` and `key_ln/scale` (D/heads,).
- `position_emb`: 'learned' (a (1, N, D) parameter, the default), 'sincos2d' (the
  fixed 2-D sine-cosine embedding of MoCo v3, `sincos2d`; a class token gets
  none) or 'none'.
- `classifier`: 'token' (class token), 'gap' (mean of the tokens), 'map'
  (`MapHead`: attention pooling with one learned probe, then a LayerNorm and a
  residual MLP, as the reference's MapHead) or '0' (the first token, no class
  token is added: the reference's classifier '0').
- `head_kernel_zero_init` False: the head kernel is drawn with flax's default
  (LeCun normal) instead of zeros.
- `num_classes` None (or 0): no head; the model returns its representation (the
  pre-logits) in place of the logits.

E³ (`ensemble_size` M > 1, `nn.ensemble`): the encoder repeats each image M times
(`jnp.repeat` on the batch axis) before its first MoE block, the MoE layers route
member m among its own E/M experts, and the model returns one row per (image,
member): logits and pre-logits (B*M, ...), rows b*M .. b*M + M-1 for image b.

Precision: parameters are always float32; `dtype` (None: float32) is the dtype
of the activations and of the matrix products (bfloat16 halves activation
memory). LayerNorm statistics and normalisation, the attention softmax and the
router (its logits layer and routing, see `nn.moe`) compute in float32 whatever
`dtype` is, and the head computes and returns float32 logits.

Memory: with `remat`, each encoder block is rematerialised (`flax.linen.remat`,
jax's default policy: nothing inside a block is saved for the backward pass but
its input), so training holds one block's activations instead of all blocks',
for about one more forward pass of compute. Parameters and outputs do not change.

Shapes: B images, N tokens per image, D hidden size, H MLP hidden size.
"""
from typing import Any, Dict, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn.moe import MoeLayer
from vmoe_sparse_ot.nn.sharding import constrain

Array = jax.Array
# model.encoder.position_emb and model.classifier (nn.model_config checks them).
POSITION_EMBS = ("learned", "sincos2d", "none")
CLASSIFIERS = ("token", "gap", "map", "0")
SINCOS2D_TEMPERATURE = 10_000.0


class MlpBlock(nn.Module):
  """Dense GELU MLP: (B, N, D) -> (B, N, D)."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Any = None

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    d = x.shape[-1]
    h = nn.Dense(self.mlp_dim, kernel_init=nn.initializers.xavier_uniform(),
                 bias_init=nn.initializers.normal(stddev=1e-6), dtype=self.dtype)(x)
    h = nn.gelu(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=not train)
    y = nn.Dense(d, kernel_init=nn.initializers.xavier_uniform(),
                 bias_init=nn.initializers.normal(stddev=1e-6), dtype=self.dtype)(h)
    return nn.Dropout(self.dropout_rate)(y, deterministic=not train)


class EncoderBlock(nn.Module):
  """x + Attn(LN(x)), then + MLP(LN(.)) or + MoE(LN(.))."""
  num_heads: int
  mlp_dim: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  moe: Optional[Dict[str, Any]] = None   # MoeLayer kwargs, None for a dense MLP
  dtype: Any = None
  attention_qk_norm: bool = False

  @nn.compact
  def __call__(self, x: Array, train: bool):
    # flax's LayerNorm takes mean and variance in float32 and normalises in
    # float32 (its statistics are float32), then casts to `dtype`.
    y = nn.LayerNorm(dtype=self.dtype, name="norm_att")(x)
    y = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dropout_rate=self.attention_dropout_rate,
        kernel_init=nn.initializers.xavier_uniform(), deterministic=not train,
        dtype=self.dtype, force_fp32_for_softmax=True, normalize_qk=self.attention_qk_norm,
        name="attention")(y, y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=not train)
    x = x + y
    y = nn.LayerNorm(dtype=self.dtype, name="norm_mlp")(x)
    if self.moe is None:
      y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, name="mlp")(y, train)
      aux, metrics = jnp.zeros((), jnp.float32), None
    else:
      # moe['dropout_rate'] and moe['mlp_dim'] (model.encoder.moe.*) replace the block's.
      y, aux, metrics = MoeLayer(name="moe", **{"mlp_dim": self.mlp_dim,
                                                "dropout_rate": self.dropout_rate,
                                                **self.moe})(y, train)
    return x + y, aux, metrics


def sincos2d(height: int, width: int, dim: int, temperature: float = SINCOS2D_TEMPERATURE
             ) -> Array:
  """The 2-D sine-cosine position embedding (MoCo v3), (height * width, dim) float32.

  Token t = i * width + j (row-major, as the patches are flattened) gets
  [sin(j w), cos(j w), sin(i w), cos(i w)], each over the dim / 4 frequencies
  w_k = temperature ** (-k / (dim / 4 - 1)), k = 0 .. dim / 4 - 1; dim must be a
  multiple of 4 and >= 8.
  """
  if dim % 4 or dim < 8:
    raise ValueError(f"model.encoder.position_emb='sincos2d' needs hidden_size a multiple "
                     f"of 4 and >= 8, got {dim}")
  quarter = dim // 4
  omega = 1.0 / temperature ** (jnp.arange(quarter, dtype=jnp.float32) / (quarter - 1))
  rows, cols = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32),
                            jnp.arange(width, dtype=jnp.float32), indexing="ij")
  x = cols.reshape(-1, 1) * omega[None]
  y = rows.reshape(-1, 1) * omega[None]
  return jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=-1)


class Encoder(nn.Module):
  """Position embeddings, dropout, blocks, final LayerNorm.

  `grid` (h, w): the patch grid, which 'sincos2d' needs; tokens before the h * w
  patches (a class token) get no sincos2d embedding.
  """
  num_layers: int
  num_heads: int
  mlp_dim: int
  moe_layers: Tuple[int, ...] = ()
  moe: Optional[Dict[str, Any]] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Any = None
  remat: bool = False
  attention_qk_norm: bool = False
  position_emb: str = "learned"
  grid: Optional[Tuple[int, int]] = None
  ensemble_size: int = 1

  @nn.compact
  def __call__(self, x: Array, train: bool):
    _, n, d = x.shape
    if self.position_emb == "learned":
      pos = self.param("pos_embedding", nn.initializers.normal(stddev=0.02), (1, n, d))
      x = x + pos.astype(x.dtype)
    elif self.position_emb == "sincos2d":
      h, w = self.grid
      prefix = n - h * w
      pos = sincos2d(h, w, d).astype(x.dtype)[None]
      x = x + pos if prefix == 0 else jnp.concatenate([x[:, :prefix], x[:, prefix:] + pos],
                                                      axis=1)
    elif self.position_emb != "none":
      raise ValueError(f"model.encoder.position_emb must be one of {list(POSITION_EMBS)}, "
                       f"got {self.position_emb!r}")
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    aux = jnp.zeros((), jnp.float32)
    routing = {}
    # `train` (argument 2, counting self) is a Python bool that picks code paths.
    block_cls = nn.remat(EncoderBlock, static_argnums=(2,)) if self.remat else EncoderBlock
    moe = self.moe
    if self.ensemble_size > 1:
      moe = {**self.moe, "ensemble_size": self.ensemble_size}
    for i in range(self.num_layers):
      name = f"encoderblock_{i}"
      if self.ensemble_size > 1 and self.moe_layers and i == min(self.moe_layers):
        x = jnp.repeat(x, self.ensemble_size, axis=0)  # E³: M members from here on.
      x, block_aux, metrics = block_cls(
          num_heads=self.num_heads, mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate,
          attention_dropout_rate=self.attention_dropout_rate,
          moe=moe if i in self.moe_layers else None, dtype=self.dtype,
          attention_qk_norm=self.attention_qk_norm, name=name)(x, train)
      aux = aux + block_aux
      if metrics is not None:
        routing[name] = metrics
    return nn.LayerNorm(dtype=self.dtype, name="encoder_norm")(x), aux, routing


class MapHead(nn.Module):
  """Multi-head attention pooling: (B, N, D) -> (B, D), as the reference's MapHead.

  One learned probe (1, 1, D) attends over the tokens (queries from the probe,
  keys and values from the tokens; no dropout), then y + MLP(LN(y)).
  """
  num_heads: int
  mlp_dim: int
  qk_norm: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    b, _, d = x.shape
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    y = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
        deterministic=True, normalize_qk=self.qk_norm,
        name="attention")(jnp.tile(probe, (b, 1, 1)), x)
    z = nn.LayerNorm(name="norm")(y)
    z = MlpBlock(self.mlp_dim, name="mlp")(z, False)
    return (y + z)[:, 0]


class VisionTransformer(nn.Module):
  """images (B, H, W, C) -> (logits (B, num_classes), aux dict); see ARCHITECTURE.md.

  With `num_classes` None (or 0) there is no head: the first output is the
  representation (B, D'), the same array as aux['pre_logits'].
  """
  num_classes: Optional[int]
  patch_size: Tuple[int, int]
  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  classifier: str = "token"
  representation_size: Optional[int] = None
  head_bias_init: float = 0.0
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  moe_layers: Tuple[int, ...] = ()
  moe: Optional[Dict[str, Any]] = None
  dtype: Any = None      # activations' dtype (None: float32); parameters stay float32
  remat: bool = False    # rematerialise each encoder block in the backward pass
  attention_qk_norm: bool = False
  position_emb: str = "learned"   # one of POSITION_EMBS
  head_kernel_zero_init: bool = True
  ensemble_size: int = 1          # E³ members M (nn.ensemble); outputs have B*M rows

  @nn.compact
  def __call__(self, images: Array, train: bool = False):
    x = nn.Conv(self.hidden_size, self.patch_size, strides=self.patch_size,
                padding="VALID", dtype=self.dtype, name="embedding")(images)
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)
    if self.classifier == "token":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, d))
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (b, 1, 1)), x], axis=1)
    x = constrain(x, (("data", "expert"),))
    x, aux_loss, routing = Encoder(
        num_layers=self.num_layers, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
        moe_layers=self.moe_layers, moe=self.moe, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
        remat=self.remat, attention_qk_norm=self.attention_qk_norm,
        position_emb=self.position_emb, grid=(h, w), ensemble_size=self.ensemble_size,
        name="encoder")(x, train)
    # The pooling and the (small) head run in float32.
    x = x.astype(jnp.float32)
    if self.classifier in ("token", "0"):
      x = x[:, 0]
    elif self.classifier == "gap":
      x = jnp.mean(x, axis=1)
    elif self.classifier == "map":
      x = MapHead(num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                  qk_norm=self.attention_qk_norm, name="map_head")(x)
    else:
      raise ValueError(f"model.classifier must be one of {list(CLASSIFIERS)}, "
                       f"got {self.classifier!r}")
    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, name="pre_logits")(x))
    pre_logits = x
    aux = {"auxiliary_loss": aux_loss, "pre_logits": pre_logits, "routing": routing}
    if not self.num_classes:  # A backbone: its representation in place of logits.
      return pre_logits, aux
    kernel_init = (nn.initializers.zeros if self.head_kernel_zero_init
                   else nn.linear.default_kernel_init)
    logits = nn.Dense(self.num_classes, kernel_init=kernel_init,
                      bias_init=nn.initializers.constant(self.head_bias_init),
                      name="head")(x)
    return logits, aux


def parse_moe_layers(spec: Any, num_layers: int) -> Tuple[int, ...]:
  """Block indices of the MoE layers, placed as the reference V-MoE places them.

  'every_N': blocks N-1, 2N-1, ... ('every_2': 1, 3, 5, ...);
  'last_N': the last N of the every-2 positions (12 blocks, 'last_2': 9 and 11);
  '1,3' or [1, 3]: those blocks.
  """
  key = "model.encoder.moe.layers"
  if isinstance(spec, (list, tuple)):
    layers = tuple(int(i) for i in spec)
  elif isinstance(spec, str) and spec.startswith("every_") and spec[6:].isdigit() \
      and int(spec[6:]) >= 1:
    n = int(spec[6:])
    layers = tuple(range(n - 1, num_layers, n))
  elif isinstance(spec, str) and spec.startswith("last_") and spec[5:].isdigit() \
      and int(spec[5:]) >= 1:
    n, odd = int(spec[5:]), tuple(range(1, num_layers, 2))
    if n > len(odd):
      raise ValueError(f"{key}={spec!r} asks for the last {n} of the {len(odd)} every-2 "
                       f"blocks {odd} of {num_layers}")
    layers = odd[-n:]
  elif isinstance(spec, str) and all(p.strip().isdigit() for p in spec.split(",") if p.strip()):
    layers = tuple(int(p) for p in spec.split(",") if p.strip())
  else:
    raise ValueError(f"{key} must be 'every_N', 'last_N' (N >= 1) or a comma-separated "
                     f"list of block indices, got {spec!r}")
  bad = [i for i in layers if not 0 <= i < num_layers]
  if bad:
    raise ValueError(f"{key} has block indices {bad} outside [0, {num_layers})")
  return tuple(sorted(set(layers)))
