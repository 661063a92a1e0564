"""Parameter names: this project's, the public ViT `.npz` files', the reference V-MoE's.

Three namings of the same parameters; the table below (`_BLOCK`, `_TOP`) is the
one source of truth, and docs/INITIALIZATION.md prints it. Inside a block:
norm_att = LayerNorm_0 (both); attention = MultiHeadDotProductAttention_1 (ViT
files) / SelfAttention (V-MoE); norm_mlp = LayerNorm_2 / LayerNorm_1; mlp =
MlpBlock_3 / Mlp; moe/experts/w{i,o}_{kernel,bias} = Moe/Mlp/Dense_{0,1}/...
(leading E axis); moe/router/kernel = Moe/Router/dense/kernel. Outside: the
encoder is `Transformer` (ViT files) / `Encoder` (V-MoE), pos_embedding sits
under posembed_input; embedding, cls, pre_logits and head keep their names;
map_head/{probe,attention,norm,mlp} (classifier='map') = MAPHead_0/{probe,
MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0} (ViT files, big_vision's
names) / MapHead/{probe, MultiHeadDotProductAttention, LayerNorm, Mlp}.
With attention_qk_norm the attention layers hold query_ln/scale and
key_ln/scale, under the same names in all three (flax's).

Shapes agree across the three (flax's attention layout: query/key/value kernels
(D, heads, D/heads), out kernel (heads, D/heads, D)), so renaming is all it takes.
The live `vit_jax` modules name the block's layers `LayerNorm_0`,
`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`; those names are
read too (`from_vit` accepts both).
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

NAMINGS = ('ours', 'vit', 'vmoe')

# (ours, vit, vmoe) for the layers inside one encoder block.
_BLOCK = (
    ('norm_att', 'LayerNorm_0', 'LayerNorm_0'),
    ('attention', 'MultiHeadDotProductAttention_1', 'SelfAttention'),
    ('norm_mlp', 'LayerNorm_2', 'LayerNorm_1'),
    ('mlp', 'MlpBlock_3', 'Mlp'),
    ('moe/experts/wi_kernel', 'Moe/Mlp/Dense_0/kernel', 'Moe/Mlp/Dense_0/kernel'),
    ('moe/experts/wi_bias', 'Moe/Mlp/Dense_0/bias', 'Moe/Mlp/Dense_0/bias'),
    ('moe/experts/wo_kernel', 'Moe/Mlp/Dense_1/kernel', 'Moe/Mlp/Dense_1/kernel'),
    ('moe/experts/wo_bias', 'Moe/Mlp/Dense_1/bias', 'Moe/Mlp/Dense_1/bias'),
    ('moe/router/kernel', 'Moe/Router/dense/kernel', 'Moe/Router/dense/kernel'),
    ('moe/router', 'Moe/Router', 'Moe/Router'),   # Other routers' parameters (soft_moe).
    # Shared experts (moe.num_shared_experts): the reference has none; this name
    # keeps them in an export under the other namings, and reads them back.
    ('moe/shared_experts', 'Moe/SharedExperts', 'Moe/SharedExperts'),
)
# The live vit_jax module names of a block's layers (files use the ones above).
_VIT_LIVE = (('LayerNorm_0', 'norm_att'), ('MultiHeadDotProductAttention_0', 'attention'),
             ('LayerNorm_1', 'norm_mlp'), ('MlpBlock_0', 'mlp'))
_TOP = {  # ours -> (vit, vmoe) outside the blocks.
    'encoder/pos_embedding': ('Transformer/posembed_input/pos_embedding',
                              'Encoder/posembed_input/pos_embedding'),
    'encoder/encoder_norm': ('Transformer/encoder_norm', 'Encoder/encoder_norm'),
    # classifier='map': the attention-pooling head (big_vision's MAPHead in ViT
    # files, the reference's MapHead).
    'map_head/probe': ('MAPHead_0/probe', 'MapHead/probe'),
    'map_head/attention': ('MAPHead_0/MultiHeadDotProductAttention_0',
                           'MapHead/MultiHeadDotProductAttention'),
    'map_head/norm': ('MAPHead_0/LayerNorm_0', 'MapHead/LayerNorm'),
    'map_head/mlp': ('MAPHead_0/MlpBlock_0', 'MapHead/Mlp'),
}
_ROOT = {'vit': 'Transformer', 'vmoe': 'Encoder'}
_BLOCK_RE = re.compile(r'^(encoder|Transformer|Encoder)/(encoderblock_\d+)/(.+)$')


def _swap_prefix(rest: str, table) -> str | None:
  """`rest` with its longest matching layer prefix replaced, or None."""
  best = None
  for old, new in table:
    if (rest == old or rest.startswith(old + '/')) and (best is None or len(old) > len(best[0])):
      best = (old, new)
  return None if best is None else best[1] + rest[len(best[0]):]


def to_ours(name: str, naming: str) -> str | None:
  """This project's name for `name` written in `naming`, or None if the table lacks it."""
  if naming == 'ours':
    return name
  col = NAMINGS.index(naming)
  for ours, theirs in _TOP.items():
    if name == theirs[col - 1] or name.startswith(theirs[col - 1] + '/'):
      return ours + name[len(theirs[col - 1]):]
  m = _BLOCK_RE.match(name)
  if m:
    if m.group(1) != _ROOT[naming]:
      return None
    table = [(row[col], row[0]) for row in _BLOCK]
    if naming == 'vit':
      table += [(live, ours) for live, ours in _VIT_LIVE]
    rest = _swap_prefix(m.group(3), table)
    return None if rest is None else f'encoder/{m.group(2)}/{rest}'
  if name.split('/')[0] in ('embedding', 'cls', 'pre_logits', 'head'):
    return name
  return None


def from_ours(name: str, naming: str) -> str:
  """`name` (this project's) written in `naming`; names outside the table are kept."""
  if naming == 'ours':
    return name
  col = NAMINGS.index(naming)
  for ours, theirs in _TOP.items():
    if name == ours or name.startswith(ours + '/'):
      return theirs[col - 1] + name[len(ours):]
  m = _BLOCK_RE.match(name)
  if m and m.group(1) == 'encoder':
    rest = _swap_prefix(m.group(3), [(row[0], row[col]) for row in _BLOCK])
    if rest is not None:
      return f'{_ROOT[naming]}/{m.group(2)}/{rest}'
  return name


def detect_naming(names) -> str:
  """'vit' if any name starts with 'Transformer/', 'vmoe' with 'Encoder/', else 'ours'."""
  roots = {n.split('/')[0] for n in names}
  if 'Transformer' in roots:
    return 'vit'
  if 'Encoder' in roots:
    return 'vmoe'
  return 'ours'


def strip_params_level(flat: Mapping[str, object]) -> dict[str, object]:
  """Drops a leading 'params/' (or a train state's 'optimizer/target/') shared by every name."""
  for prefix in ('params/', 'optimizer/target/', 'opt/target/'):
    if flat and all(k.startswith(prefix) for k in flat):
      return {k[len(prefix):]: v for k, v in flat.items()}
  return dict(flat)


def rename(flat: Mapping[str, object], convert: Callable[[str], str | None]
           ) -> tuple[dict[str, object], dict[str, str]]:
  """(renamed entries, {new name: old name}); names `convert` maps to None keep theirs."""
  out, origin = {}, {}
  for old, value in flat.items():
    new = convert(old) or old
    if new in out:
      raise ValueError(f'source names {origin[new]!r} and {old!r} both map to {new!r}')
    out[new], origin[new] = value, old
  return out, origin
