"""config.paper: the paper's B/32 and B/16 recipes and the fine-tuning recipe, key by key."""
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.nn.model_config import variant_sizes
from vmoe_sparse_ot import config as config_lib
from tests.config.helpers import load


@pytest.mark.parametrize('name,patch', [('vmoe_b32.py', 32), ('vmoe_b16.py', 16)])
def test_paper_configs_match_the_paper(name, patch):
  config = load(name)
  m = config.model
  assert m.patch_size == (patch, patch) and m.hidden_size == 768
  assert m.encoder.num_layers == 12 and m.encoder.mlp_dim == 3072
  # The V-MoE-B sizes (as model.variant='V-MoE-B/P' sets them), pre-logits of size D.
  sizes = variant_sizes(f'V-MoE-B/{patch}')
  assert (m.hidden_size, m.encoder.num_layers, m.encoder.num_heads, m.encoder.mlp_dim,
          m.patch_size, m.representation_size) == tuple(
              sizes[k] for k in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim',
                                 'patch_size', 'representation_size'))
  assert m.encoder.moe.layers == 'every_2' and m.encoder.moe.num_experts == 32
  router = m.encoder.moe.router
  assert router.name == 'sparse_ot' and router.num_selected_experts == 2
  # V-MoE recipe: groups of 8 images, capacity factor 1.05; the paper's k = 16.
  assert m.encoder.moe.group_size == 8 * ((224 // patch) ** 2 + 1)
  assert router.capacity is None and router.capacity_factor == 1.05
  assert router.sparse_ot.k == 16
  # The reference's defaults: experts initialized alike, gate noise 1/E (noise_std 1).
  assert m.encoder.moe.split_rngs is False and router.noise_std == 1.0
  assert (m.encoder.moe.dispatcher, m.encoder.moe.routed_tokens_dtype) == ('einsum', 'bfloat16')
  assert router.sparse_ot.form == 'expert_choice'
  assert (router.sparse_ot.solver, router.sparse_ot.num_steps,
          router.sparse_ot.learning_rate) == ('adam', 50, 1e-2)
  assert config.optimizer.name == 'adam' and config.optimizer.weight_decay == 0.1
  assert config.schedule.name == 'warmup_linear_decay'
  assert config.schedule.warmup_steps == 10_000
  assert config.batch_size == 4096 and config.dataset.name == 'imagenet2012'
  assert m.num_classes == 1000
  assert load(name, 'dataset=imagenet21k').model.num_classes == 21_843
  config_lib.validate(config)
  nn.build_model(m)


def test_finetune_config_is_the_reference_recipe():
  config = load('vmoe_b16_ft_imagenet.py', 'init=/ckpt/vmoe_b16,data_dir=/data')
  m = config.model
  assert (m.hidden_size, m.encoder.num_layers, m.encoder.mlp_dim, m.patch_size) == (
      768, 12, 3072, (16, 16))
  assert m.encoder.moe.num_experts == 8 and m.encoder.moe.router.num_selected_experts == 2
  assert m.encoder.moe.group_size == 8 * (24 * 24 + 1) and m.representation_size is None
  assert m.encoder.moe.router.capacity_factor == 1.5 and m.num_classes == 1000
  assert config.dataset.image_size == 384 and config.batch_size == 1024
  assert config.dataset.pp_train == (
      'decode_jpeg_and_inception_crop(384)|flip_lr|value_range(-1, 1)')
  assert config.dataset.pp_eval == 'decode|resize(384)|value_range(-1, 1)'
  assert config.train_steps == 10_000 and config.initialization.path == '/ckpt/vmoe_b16'
  o, s = config.optimizer, config.schedule
  assert (o.name, o.momentum, o.gradient_clip_norm, o.weight_decay) == ('sgd', 0.9, 10.0, 0.0)
  assert (s.name, s.peak_value, s.warmup_steps, s.end_value) == (
      'warmup_cosine_decay', 0.003, 500, 1e-5)
  config_lib.validate(config)
