"""V-MoE S/32, Last 2, E=8, K=2 on ILSVRC2012, in the reference V-MoE code's config layout.

Written for the tests from that layout's documentation (keys, nesting, defaults),
not copied from any of its files; it imports nothing of the reference.
"""
import math

import ml_collections

NUM_CLASSES = 1000
BATCH_SIZE = 4096
LABELS = f'onehot({NUM_CLASSES}, inkey="label", outkey="labels")|keep("image", "labels")'


def _data(name, split, process, **extra):
  config = ml_collections.ConfigDict(type_safe=False)
  config.name, config.split, config.process = name, split, process
  config.batch_size = BATCH_SIZE
  config.prefetch = 'autotune'
  config.prefetch_device = 2
  config.update(extra)
  return config


def _eval(name, split, labels=LABELS):
  return _data(name, split, f'decode|resize_small(256)|central_crop(224)|value_range(-1,1)|'
               f'{labels}', cache='batched')


def get_config():
  config = ml_collections.ConfigDict()
  config.dataset = ml_collections.ConfigDict()
  config.dataset.train = _data(
      'imagenet2012', 'train[:99%]',
      f'decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2, 10)|value_range(-1,1)|{LABELS}',
      shuffle_buffer=50_000, manual_dir=None)
  config.dataset.val = _eval('imagenet2012', 'train[99%:]')
  config.dataset.test = _eval('imagenet2012', 'validation')
  config.dataset.imagenet_v2 = _eval('imagenet_v2', 'test')
  config.dataset.imagenet_real = _eval(
      'imagenet2012_real', 'validation',
      f'onehot({NUM_CLASSES}, inkey="real_label", outkey="labels")|keep("image", "labels")')
  config.loss = ml_collections.ConfigDict({'name': 'sigmoid_xent'})
  config.description = 'ViT-S/32, E=8, K=2, Last 2, 300 Epochs'
  config.model = ml_collections.ConfigDict({
      'name': 'VisionTransformerMoe',
      'num_classes': NUM_CLASSES,
      'patch_size': (32, 32),
      'hidden_size': 512,
      'classifier': 'token',
      'representation_size': 512,
      'head_bias_init': -math.log(NUM_CLASSES),
      'encoder': {
          'num_layers': 8, 'mlp_dim': 2048, 'num_heads': 8,
          'dropout_rate': 0.0, 'attention_dropout_rate': 0.0,
          'moe': {
              'num_experts': 8,
              'layers': (5, 7),
              'dropout_rate': 0.2,
              'split_rngs': False,
              'group_size': 8 * 50,
              'router': {
                  'num_selected_experts': 2,
                  'noise_std': 1.0,
                  'importance_loss_weight': 0.005,
                  'load_loss_weight': 0.005,
                  'dispatcher': {
                      'name': 'einsum', 'bfloat16': True, 'capacity_factor': 1.05,
                      'partition_spec': (('expert', 'replica'),),
                      'batch_priority': False,
                  },
              },
          },
      },
  })
  config.optimizer = ml_collections.ConfigDict({
      'name': 'adam', 'b1': 0.9, 'b2': 0.999, 'mu_dtype': 'float32',
      'weight_decay': [('.*/kernel', 0.1)],
      'learning_rate': {'schedule': 'warmup_linear_decay', 'peak_value': 3e-3,
                        'end_value': 1e-5, 'warmup_steps': 10_000},
      'gradient_clip': {'global_norm': 1.0},
  })
  config.train_epochs = 300
  config.mixup = ml_collections.ConfigDict(
      {'concentration': 0.2, 'granularity': 'device', 'size': 2})
  config.num_expert_partitions = 8
  config.params_axis_resources = [('Moe/Mlp/.*', ('expert',))]
  config.extra_rng_keys = ('dropout', 'gating', 'mixup')
  config.evaluate = ml_collections.ConfigDict({
      'every_steps': 1000,
      'model_overrides': {'encoder': {'moe': {'router': {'dispatcher': {
          'capacity_factor': 4.0}}}}}})
  config.save_checkpoint = ml_collections.ConfigDict(
      {'every_steps': 1000, 'keep_last': 1, 'wait_seconds': 300})
  config.report_progress = ml_collections.ConfigDict({'every_secs': None, 'every_steps': 100})
  config.profile = ml_collections.ConfigDict({'all_processes': False, 'num_profile_steps': 5,
                                              'first_profile': 10, 'every_secs': 3600.0})
  config.seed = 0
  return config
