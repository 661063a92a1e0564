"""Fine-tune a V-MoE B/16, Every 2, E=8, K=2 checkpoint on CIFAR-10 at 384 px, in the
reference V-MoE code's config layout, with its `:ARG` (here `variant=ARG` picks the
learning rate), an `initialization` section and a `fewshot` section.

Written for the tests from that layout's documentation, not copied from any of its
files; it imports nothing of the reference.
"""
import ml_collections

NUM_CLASSES = 10
LABELS = f'onehot({NUM_CLASSES}, inkey="label", outkey="labels")|keep("image", "labels")'


def get_config(arg=None):
  peak = {'fast': 0.03, None: 0.01}[arg.partition('=')[2] if arg else None]
  config = ml_collections.ConfigDict()
  config.dataset = ml_collections.ConfigDict({
      'train': {'name': 'cifar10', 'split': 'train[:98%]', 'batch_size': 512,
                'process': f'decode|inception_crop(384)|flip_lr|value_range(-1,1)|{LABELS}',
                'shuffle_buffer': 25_000, 'cache': 'loaded'},
      'val': {'name': 'cifar10', 'split': 'train[98%:]', 'batch_size': 1024,
              'process': f'decode|resize(384)|value_range(-1,1)|{LABELS}', 'cache': 'batched'},
      'test': {'name': 'cifar10', 'split': 'test', 'batch_size': 1024,
               'process': f'decode|resize(384)|value_range(-1,1)|{LABELS}', 'cache': 'batched'},
  })
  config.loss = ml_collections.ConfigDict({'name': 'softmax_xent'})
  config.train_steps = 1000
  config.microsteps = 2
  config.model = ml_collections.ConfigDict({
      'name': 'VisionTransformerMoe', 'num_classes': NUM_CLASSES, 'patch_size': (16, 16),
      'hidden_size': 768, 'classifier': 'token', 'representation_size': None,
      'encoder': {'num_layers': 12, 'mlp_dim': 3072, 'num_heads': 12,
                  'dropout_rate': 0.0, 'attention_dropout_rate': 0.0,
                  'moe': {'num_experts': 8, 'layers': (1, 3, 5, 7, 9, 11),
                          'group_size': 4 * 577, 'split_rngs': False,
                          'router': {'num_selected_experts': 2, 'noise_std': 1.0,
                                     'importance_loss_weight': 0.005,
                                     'load_loss_weight': 0.005,
                                     'dispatcher': {'name': 'einsum', 'bfloat16': True,
                                                    'capacity_factor': 1.5,
                                                    'batch_priority': True}}}},
  })
  config.initialization = ml_collections.ConfigDict({
      'name': 'initialize_from_vmoe',
      'prefix': 'gs://my_bucket/vmoe_b16_e8_every2',
      'rules': [('head', ''), ('^(.*/pos_embedding)$', r'params/\1', 'vit_zoom'),
                ('^(.*)$', r'params/\1')],
      'raise_if_target_unmatched': False,
      'axis_resources_regexes': [('Moe/Mlp/.*', ('expert',))],
  })
  config.optimizer = ml_collections.ConfigDict({
      'name': 'sgd', 'momentum': 0.9, 'accumulator_dtype': 'float32',
      'learning_rate': {'schedule': 'warmup_cosine_decay', 'peak_value': peak,
                        'end_value': 1e-5, 'warmup_steps': 100, 'decay_steps': 900},
      'gradient_clip': {'global_norm': 10.0},
  })
  config.fewshot = ml_collections.ConfigDict({
      'datasets': {'pets': ('oxford_iiit_pet', 'train', 'test')},
      'shots': [1, 5, 10, 25], 'l2_regs': [2.0 ** i for i in range(-10, 20)],
      'batch_size': 1024, 'every_steps': 500, 'seeds_per_step': 1,
      'process': 'decode|resize(256)|central_crop(224)|value_range(-1, 1)|keep("image", "label")',
      'main_task': ('pets', 10), 'cache': 'loaded',
      'model_overrides': {'num_classes': None}})
  config.num_expert_partitions = 8
  config.params_axis_resources = [('Moe/Mlp/.*', ('expert',))]
  config.extra_rng_keys = ('dropout', 'gating')
  config.save_checkpoint = ml_collections.ConfigDict(
      {'every_steps': 250, 'keep_last': 2, 'keep_steps_multiple_of': 500})
  config.report_progress = ml_collections.ConfigDict({'every_steps': 50})
  config.evaluate = ml_collections.ConfigDict({'every_steps': 250})
  config.seed = 3
  return config
