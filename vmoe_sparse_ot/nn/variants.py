"""`model.variant`: the named ViT and V-MoE sizes ('B/16', 'V-MoE-S/32', ...)."""
from typing import Optional

from vmoe_sparse_ot.nn.routers.base import OptionError

# (hidden_size, num_layers, num_heads, mlp_dim) of the ViT sizes (Dosovitskiy et al.).
VIT_SIZES = {
    'Ti': (192, 12, 3, 768),
    'S': (384, 12, 6, 1536),
    'B': (768, 12, 12, 3072),
    'L': (1024, 24, 16, 4096),
    'H': (1280, 32, 16, 5120),
}
# The same for the V-MoE sizes (Riquelme et al. 2021, as the reference V-MoE configs
# set them). Only S differs from ViT's: the V-MoE S has 8 blocks of D 512.
VMOE_SIZES = {
    'S': (512, 8, 8, 2048),
    'B': (768, 12, 12, 3072),
    'L': (1024, 24, 16, 4096),
    'H': (1280, 32, 16, 5120),
}
VMOE_PREFIX = 'V-MoE-'
# What a `model.variant` must be (the allowed part of its error message).
ALLOWED = (f'must be SIZE/PATCH with SIZE in {list(VIT_SIZES)} (e.g. "B/32"), '
           f'{VMOE_PREFIX}SIZE/PATCH with SIZE in {list(VMOE_SIZES)} (e.g. '
           f'"{VMOE_PREFIX}S/32") or None')


def _parse(variant) -> Optional[dict]:
  text = str(variant)
  vmoe = text.startswith(VMOE_PREFIX)
  sizes = VMOE_SIZES if vmoe else VIT_SIZES
  size, _, patch = text[len(VMOE_PREFIX) if vmoe else 0:].partition('/')
  if size not in sizes or not patch.isdigit() or int(patch) < 1:
    return None
  hidden, layers, heads, mlp = sizes[size]
  return {'hidden_size': hidden, 'num_layers': layers, 'num_heads': heads, 'mlp_dim': mlp,
          'patch_size': (int(patch), int(patch)),
          'representation_size': hidden if vmoe else None}


def is_variant(variant) -> bool:
  """Whether `variant` names a size that `variant_sizes` knows."""
  return _parse(variant) is not None


def variant_sizes(variant: str) -> dict:
  """The keys a `model.variant` sets: 'B/16' (ViT sizes) or 'V-MoE-S/32' (V-MoE sizes).

  Returns {hidden_size, num_layers, num_heads, mlp_dim, patch_size: (P, P),
  representation_size}: representation_size is D for V-MoE variants (the
  reference V-MoE configs' pre-logits layer), None for ViT ones. Raises
  `OptionError` naming `model.variant` and the accepted forms.
  """
  sizes = _parse(variant)
  if sizes is None:
    raise OptionError('model.variant', variant, ALLOWED)
  return sizes
