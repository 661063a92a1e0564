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
