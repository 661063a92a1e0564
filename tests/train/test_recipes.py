"""The configs/ recipes train: the paper's B/16 (B/32's config differs only in its patch and
group sizes) and the fine-tuning recipe from a reference-format checkpoint, each shrunken,
for one step (end to end, through the trainer)."""
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot import config as config_lib
from tests.config.helpers import load


def test_paper_b32_and_b16_configs_differ_only_in_patch_and_group_size():
  """So the B/16 run below trains B/32's recipe too (both shrink to the same model
  but for the patch size)."""
  b32, b16 = (config_lib.flatten(load(name).to_dict()) for name in ('vmoe_b32.py', 'vmoe_b16.py'))
  assert b32.keys() == b16.keys()
  assert {k: (b32[k], b16[k]) for k in b32 if b32[k] != b16[k]} == {
      'model.patch_size': ([32, 32], [16, 16]),
      'model.encoder.moe.group_size': (8 * (224 // 32) ** 2 + 8, 8 * (224 // 16) ** 2 + 8)}


@pytest.mark.parametrize('name', ['vmoe_b16.py'])
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


def test_finetune_config_one_step_dry_run_from_a_reference_checkpoint(tmp_path, caplog):
  """Shrunken: a 'released' V-MoE at 16 px with 21 classes, in the reference's partitioned
  format, fine-tuned at 32 px on 10 classes: zoom and new head by default, one step."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot import initialization  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import trainer  # pylint: disable=g-import-not-at-top
  from tests.initialization.test_partitioned import build, dump  # pylint: disable=g-import-not-at-top

  def shrink(config, image_size, num_classes):
    m = config.model
    m.hidden_size, m.patch_size, m.num_classes = 32, (8, 8), num_classes
    m.encoder.num_layers, m.encoder.num_heads, m.encoder.mlp_dim = 2, 2, 64
    m.encoder.moe.num_experts, m.encoder.moe.group_size = 4, 8
    config.dataset.image_size = image_size
    config.dataset.pp_train = (f'decode_jpeg_and_inception_crop({image_size})|flip_lr|'
                               'value_range(-1, 1)')  # PNG digits: decoded, then cropped.
    config.dataset.pp_eval = f'decode|resize({image_size})|value_range(-1, 1)'
    return config

  upstream = shrink(load('vmoe_b16_ft_imagenet.py'), 16, 21)
  model = nn.build_model(upstream.model)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False)['params'],
                          jax.ShapeDtypeStruct((1, 16, 16, 3), np.float32))
  rng = np.random.default_rng(0)
  ref = {initialization.from_ours(k, 'vmoe'): (0.1 * rng.normal(size=v.shape)).astype(np.float32)
         for k, v in initialization.flatten_tree(shapes).items()}
  dump(str(tmp_path / 'vmoe_b16'), *build(ref, {k: [(tuple((0, d) for d in v.shape), 0)]
                                                for k, v in ref.items()}, 1))

  config = shrink(load('vmoe_b16_ft_imagenet.py', f'init={tmp_path}/vmoe_b16,steps=1'), 32, 10)
  config.dataset.name, config.dataset.data_dir = 'sklearn_digits', None
  config.dataset.train_split, config.dataset.eval_split = 'train', 'test[:16]'
  config.dataset.shuffle_buffer = 64
  config.batch_size, config.eval_batch_size = 8, 8
  config_lib.check_before_training(config, str(tmp_path / 'w'))
  with caplog.at_level('INFO'):
    summary = trainer.train_and_evaluate(config, str(tmp_path / 'w'), devices=jax.devices()[:1])
  assert summary['step'] == 1 and np.isfinite(summary['losses'][0])
  assert 'position embedding resized from a 2x2 to a 4x4 patch grid' in caplog.text
  assert 'head re-initialized' in caplog.text
  assert f'Initialized {len(ref) - 2} of {len(ref)} parameters' in caplog.text
