"""Configs: contents, locking, short-form arguments, and clear failures."""
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.train import config as config_lib
from tests.train.helpers import ROOT, TINY


def load(name, arg=None):
  path = str(ROOT / 'configs' / name)
  return config_lib.load_config_file(f'{path}:{arg}' if arg else path)


def test_tiny_config_defaults_and_router_short_form():
  config = load('vmoe_tiny_mnist.py')
  assert config.dataset.name == 'embedded_mnist'
  assert config.model.encoder.moe.router.name == 'sparse_ot'
  assert load('vmoe_tiny_mnist.py', 'router=sbase').model.encoder.moe.router.name == 'sbase'
  assert load('vmoe_tiny_mnist.py', 'router=topk,steps=7').train_steps == 7
  config_lib.validate(config)
  assert config.fewshot.datasets  # Few-shot keys come from default_fewshot_config().


@pytest.mark.parametrize('name,patch', [('vmoe_b32.py', 32), ('vmoe_b16.py', 16)])
def test_paper_configs_match_the_paper(name, patch):
  config = load(name)
  m = config.model
  assert m.patch_size == (patch, patch) and m.hidden_size == 768
  assert m.encoder.num_layers == 12 and m.encoder.mlp_dim == 3072
  assert m.encoder.moe.layers == 'every_2' and m.encoder.moe.num_experts == 32
  router = m.encoder.moe.router
  assert router.name == 'sparse_ot' and router.num_selected_experts == 2
  # V-MoE recipe: groups of 8 images, capacity factor 1.05; the paper's k = 16.
  assert m.encoder.moe.group_size == 8 * ((224 // patch) ** 2 + 1)
  assert router.capacity is None and router.capacity_factor == 1.05
  assert router.sparse_ot.k == 16
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


def test_configs_are_locked():
  config = load('vmoe_tiny_mnist.py')
  with pytest.raises(AttributeError, match='router'):
    config.model.encoder.moe.routr = {'name': 'topk'}
  with pytest.raises(ValueError, match=r"unknown config argument 'routr'; valid keys: "
                     r"\['router', 'steps'\]"):
    load('vmoe_tiny_mnist.py', 'routr=topk')


def test_override_typo_names_valid_keys():
  config = load('vmoe_tiny_mnist.py')
  message = config_lib.explain_override(
      config, ['--config.model.encoder.moe.router.name=topk',
               '--config.model.encoder.moe.routr.name=topk'])
  assert "Unknown config key 'routr'" in message
  assert 'valid keys under config.model.encoder.moe:' in message
  for key in ('dispatcher', 'group_size', 'layers', 'num_experts', 'router'):
    assert key in message
  assert config_lib.explain_override(config, ['--config.seed=3']) is None


def test_unknown_router_and_bad_sections_fail_clearly():
  config = load('vmoe_tiny_mnist.py', 'router=sinkhorn_magic')
  with pytest.raises(ValueError, match=r"router.name must be one of .*sparse_ot"):
    nn.build_model(config.model)
  config = load('vmoe_tiny_mnist.py')
  config.optimizer.name = 'adagrad'
  with pytest.raises(ValueError, match=r"optimizer.name must be one of \['adam', 'adamw', "
                     r"'sgd'\]"):
    config_lib.validate(config)
  assert TINY.endswith('vmoe_tiny_mnist.py')


@pytest.mark.parametrize('name', ['vmoe_b32.py', 'vmoe_b16.py'])
def test_paper_configs_one_step_dry_run_shrunken(name, tmp_path):
  import jax  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import trainer  # pylint: disable=g-import-not-at-top
  config = load(name)
  m = config.model
  # Shrink sizes, keep the structure (Every-2 MoE, K=2, capacity, router, optimizer).
  m.hidden_size, m.representation_size = 32, 32
  m.encoder.num_layers, m.encoder.num_heads, m.encoder.mlp_dim = 2, 2, 64
  m.encoder.moe.num_experts, m.encoder.moe.group_size = 4, 8
  m.encoder.moe.router.capacity = 4
  m.encoder.moe.router.sparse_ot.num_steps = 5
  # An embedded dataset stands in for ImageNet (natural-image path: crop and flip).
  config.dataset.name, config.dataset.data_dir = 'sklearn_digits', None
  config.dataset.train_split, config.dataset.eval_split = 'train', 'test[:16]'
  config.dataset.image_size, config.dataset.shuffle_buffer = 32, 64
  config.batch_size, config.eval_batch_size, config.train_steps = 8, 8, 1
  config.fewshot.every_steps = 0
  summary = trainer.train_and_evaluate(config, str(tmp_path), devices=jax.devices()[:1])
  assert summary['step'] == 1 and len(summary['losses']) == 1
  assert summary['eval']['num_examples'] == 16
