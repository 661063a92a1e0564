"""nn.model_config: the default model config (the option fields' defaults, and by
hand), and the model's prefix tokens."""
import dataclasses

import pytest

from vmoe_sparse_ot.nn import model_config
from vmoe_sparse_ot.nn import model_options as mo
from vmoe_sparse_ot.nn import routers

SECTIONS = ((mo.ModelOptions, ()), (mo.EncoderOptions, ("encoder",)),
            (mo.MoeOptions, ("encoder", "moe")))


def test_the_default_config_is_the_fields_defaults():
  config = model_config.default_model_config()
  for options, path in SECTIONS:
    node = config
    for key in path:
      node = node[key]
    assert set(node.keys()) == set(mo.keys(options))
    for f in dataclasses.fields(options):
      assert f.metadata["doc"], f.name                       # every option documented
      if "section" not in f.metadata:
        assert node[f.name] == f.default, f.name
  assert config.encoder.moe.router.to_dict() == routers.default_config()   # the routers' own
  # A None default keeps its type, so the command line can set it.
  config.variant, config.encoder.moe.dropout_rate = "B/16", 0.1
  with pytest.raises(TypeError):
    config.dtype = 3
  # Parsed back, the defaults are the dataclasses' own.
  assert mo.model_options(model_config.default_model_config()) == mo.ModelOptions()


def test_the_default_model_is_a_small_vmoe():
  """Written out: 4 blocks of D 64 (4 heads, MLP 128) on 4x4 patches, every second
  block an MoE layer of 8 experts over groups of 64 tokens, top-2 routing at
  capacity factor 1, a class token and 10 classes."""
  c = model_config.default_model_config()
  assert (c.name, c.variant, c.hidden_size, c.patch_size, c.num_classes, c.classifier,
          c.representation_size) == ("vit_moe", None, 64, (4, 4), 10, "token", None)
  e = c.encoder
  assert (e.num_layers, e.num_heads, e.mlp_dim, e.dropout_rate) == (4, 4, 128, 0.0)
  assert (e.moe.layers, e.moe.num_experts, e.moe.group_size) == ("every_2", 8, 64)
  r = e.moe.router
  assert (r.name, r.num_selected_experts, r.capacity_factor, r.capacity) == ("topk", 2, 1.0,
                                                                            None)
  assert (r.importance_loss_weight, r.load_loss_weight, r.noise_std) == (0.005, 0.005, 1.0)
  assert model_config.COMPUTE_KEYS == ("dtype", "remat")
  assert (c.dtype, c.remat) == (None, False)


def test_num_prefix_tokens_is_one_for_the_class_token_only():
  assert model_config.num_prefix_tokens(model_config.default_model_config()) == 1
  assert model_config.num_prefix_tokens({"classifier": "gap"}) == 0
  assert model_config.num_prefix_tokens({"classifier": "token"}) == 1
  assert model_config.num_prefix_tokens({}) == 1           # the default classifier: 'token'
