"""The three namings: this project's, the public ViT .npz files', the reference V-MoE's."""
import pytest

from vmoe_sparse_ot.initialization import names

# (ours, vit, vmoe), written by hand from the public files' and the reference code's names.
TABLE = [
    ('embedding/kernel', 'embedding/kernel', 'embedding/kernel'),
    ('cls', 'cls', 'cls'),
    ('encoder/pos_embedding', 'Transformer/posembed_input/pos_embedding',
     'Encoder/posembed_input/pos_embedding'),
    ('encoder/encoderblock_0/norm_att/scale', 'Transformer/encoderblock_0/LayerNorm_0/scale',
     'Encoder/encoderblock_0/LayerNorm_0/scale'),
    ('encoder/encoderblock_3/attention/query/kernel',
     'Transformer/encoderblock_3/MultiHeadDotProductAttention_1/query/kernel',
     'Encoder/encoderblock_3/SelfAttention/query/kernel'),
    ('encoder/encoderblock_3/norm_mlp/bias', 'Transformer/encoderblock_3/LayerNorm_2/bias',
     'Encoder/encoderblock_3/LayerNorm_1/bias'),
    ('encoder/encoderblock_10/mlp/Dense_1/kernel',
     'Transformer/encoderblock_10/MlpBlock_3/Dense_1/kernel',
     'Encoder/encoderblock_10/Mlp/Dense_1/kernel'),
    ('encoder/encoderblock_11/moe/experts/wi_kernel',
     'Transformer/encoderblock_11/Moe/Mlp/Dense_0/kernel',
     'Encoder/encoderblock_11/Moe/Mlp/Dense_0/kernel'),
    ('encoder/encoderblock_11/moe/experts/wo_bias',
     'Transformer/encoderblock_11/Moe/Mlp/Dense_1/bias',
     'Encoder/encoderblock_11/Moe/Mlp/Dense_1/bias'),
    ('encoder/encoderblock_11/moe/router/kernel',
     'Transformer/encoderblock_11/Moe/Router/dense/kernel',
     'Encoder/encoderblock_11/Moe/Router/dense/kernel'),
    ('encoder/encoder_norm/scale', 'Transformer/encoder_norm/scale', 'Encoder/encoder_norm/scale'),
    ('pre_logits/kernel', 'pre_logits/kernel', 'pre_logits/kernel'),
    ('head/bias', 'head/bias', 'head/bias'),
    # The Soft MoE recipe's layers: qk-norm (flax's names, under the attention layer),
    # the soft_moe router's slot vectors, the MAP head (big_vision's MAPHead_0 in ViT
    # files; the reference's MapHead).
    ('encoder/encoderblock_3/attention/query_ln/scale',
     'Transformer/encoderblock_3/MultiHeadDotProductAttention_1/query_ln/scale',
     'Encoder/encoderblock_3/SelfAttention/query_ln/scale'),
    ('encoder/encoderblock_11/moe/router/mu', 'Transformer/encoderblock_11/Moe/Router/mu',
     'Encoder/encoderblock_11/Moe/Router/mu'),
    ('map_head/probe', 'MAPHead_0/probe', 'MapHead/probe'),
    ('map_head/attention/key_ln/scale', 'MAPHead_0/MultiHeadDotProductAttention_0/key_ln/scale',
     'MapHead/MultiHeadDotProductAttention/key_ln/scale'),
    ('map_head/norm/bias', 'MAPHead_0/LayerNorm_0/bias', 'MapHead/LayerNorm/bias'),
    ('map_head/mlp/Dense_1/kernel', 'MAPHead_0/MlpBlock_0/Dense_1/kernel',
     'MapHead/Mlp/Dense_1/kernel'),
]


@pytest.mark.parametrize('ours,vit,vmoe', TABLE)
def test_table_both_ways(ours, vit, vmoe):
  assert names.from_ours(ours, 'vit') == vit and names.from_ours(ours, 'vmoe') == vmoe
  assert names.to_ours(vit, 'vit') == ours and names.to_ours(vmoe, 'vmoe') == ours


def test_live_vit_jax_module_names_are_read_too():
  assert (names.to_ours('Transformer/encoderblock_2/MultiHeadDotProductAttention_0/out/bias',
                        'vit') == 'encoder/encoderblock_2/attention/out/bias')
  assert (names.to_ours('Transformer/encoderblock_2/MlpBlock_0/Dense_0/kernel', 'vit')
          == 'encoder/encoderblock_2/mlp/Dense_0/kernel')


def test_unknown_names_and_detection():
  assert names.to_ours('Transformer/encoderblock_0/Adapter/kernel', 'vit') is None
  assert names.to_ours('Encoder/encoderblock_0/LayerNorm_0/scale', 'vit') is None
  assert names.detect_naming(['cls', 'Transformer/encoder_norm/bias']) == 'vit'
  assert names.detect_naming(['Encoder/encoder_norm/bias']) == 'vmoe'
  assert names.detect_naming(['encoder/encoder_norm/bias']) == 'ours'
  assert names.strip_params_level({'params/a': 1, 'params/b': 2}) == {'a': 1, 'b': 2}
  assert names.strip_params_level({'params/a': 1, 'b': 2}) == {'params/a': 1, 'b': 2}


@pytest.mark.parametrize('naming', ['vit', 'vmoe'])
def test_the_soft_moe_recipe_layers_round_trip_through_export_and_initialization(
    naming, tmp_path):
  """A MAP head, qk-norm and soft_moe model exported in a naming initializes itself back,
  every array accounted for (abstract shapes, numpy arrays: nothing compiled)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot import export, initialization, nn  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.initialization import npz  # pylint: disable=g-import-not-at-top
  cfg = nn.model_config.default_model_config()
  cfg.classifier, cfg.encoder.attention_qk_norm = 'map', True
  cfg.encoder.moe.router.name = 'soft_moe'
  cfg.encoder.moe.router.soft_moe.num_slots = 1
  model = nn.build_model(cfg)
  shapes = jax.eval_shape(lambda: model.init({'params': jax.random.key(0)},
                                             jnp.zeros((1, 16, 16, 3)))['params'])
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.standard_normal(s.shape).astype(np.float32), shapes)
  arrays = export.exported_arrays(params, naming)
  head = 'MAPHead_0/' if naming == 'vit' else 'MapHead/'
  # The probe, 8 attention arrays and 2 qk-norm scales, 2 LayerNorm, 4 MLP.
  assert sum(name.startswith(head) for name in arrays) == 17
  path = str(tmp_path / 'weights.npz')
  npz.write_npz(path, arrays)
  flat = initialization.flatten_tree(params)
  mapped, _ = initialization.plan({k: v.shape for k, v in flat.items()},
                                  {'path': path, 'raise_if_source_unmatched': True},
                                  num_prefix_tokens=0)
  assert not mapped.uninitialized and not mapped.unused and set(mapped.params) == set(flat)
  for name, value in flat.items():
    np.testing.assert_array_equal(mapped.params[name], value)
