"""nn.variants: `model.variant` names against the published sizes, written out by hand."""
import pytest

from vmoe_sparse_ot.nn import variants
from vmoe_sparse_ot.nn.routers.base import OptionError


def _sizes(variant):
  s = variants.variant_sizes(variant)
  return (s['hidden_size'], s['num_layers'], s['num_heads'], s['mlp_dim'], s['patch_size'],
          s['representation_size'])


@pytest.mark.parametrize('variant, want', [
    # ViT (Dosovitskiy et al., Table 1: layers 12/24/32, D 768/1024/1280, MLP 3072/
    # 4096/5120, heads 12/16/16); Ti and S as DeiT defined them. No pre-logits.
    ('B/32', (768, 12, 12, 3072, (32, 32), None)),
    ('L/16', (1024, 24, 16, 4096, (16, 16), None)),
    ('H/14', (1280, 32, 16, 5120, (14, 14), None)),
    ('Ti/16', (192, 12, 3, 768, (16, 16), None)),
    ('S/8', (384, 12, 6, 1536, (8, 8), None)),
    # V-MoE: B as ViT-B plus a pre-logits layer of size D; its S has 8 blocks of D 512.
    ('V-MoE-B/16', (768, 12, 12, 3072, (16, 16), 768)),
    ('V-MoE-S/32', (512, 8, 8, 2048, (32, 32), 512)),
])
def test_variant_sizes_are_the_published_ones(variant, want):
  assert _sizes(variant) == want
  assert variants.is_variant(variant)


def test_a_bad_variant_names_the_key_and_the_accepted_forms():
  with pytest.raises(OptionError) as e:
    variants.variant_sizes('V-MoE-Ti/16')   # ViT has a Ti, V-MoE none.
  assert str(e.value) == (
      "model.variant must be SIZE/PATCH with SIZE in ['Ti', 'S', 'B', 'L', 'H'] (e.g. "
      "\"B/32\"), V-MoE-SIZE/PATCH with SIZE in ['S', 'B', 'L', 'H'] (e.g. \"V-MoE-S/32\") "
      "or None, got 'V-MoE-Ti/16'")
  for bad in ('Q/16', 'B/0', 'B/', 'B16', 'b/16', 'B/16x', 'V-MoE-B', None):
    assert not variants.is_variant(bad), bad
    with pytest.raises(OptionError) as e:
      variants.variant_sizes(bad)
    assert (e.value.key, e.value.value, e.value.allowed) == ('model.variant', bad,
                                                             variants.ALLOWED)
