"""Fine-tune an E³ S/32 (8 blocks of D 512, MoE in blocks 5 and 7, E=8, K=1, M=2)
on CIFAR-100 at 128 px, in the reference V-MoE code's config layout for its
ensemble model (`VisionTransformerMoeEnsemble`, the ensemble loss, the router
reshape rule of its initialization).

Written for the tests from that layout's documentation, not copied from any of its
files; it imports nothing of the reference.
"""
import ml_collections

CLASSES = 100
MEMBERS = 2
TOKENS = (128 // 32) ** 2 + 1          # 16 patches and the class token
LABELS = f'onehot({CLASSES}, inkey="label", outkey="labels")|keep("image", "labels")'


def _variant(split, process, **extra):
  return {'name': 'cifar100', 'split': split, 'process': process, 'batch_size': 1024,
          'prefetch': 'autotune', 'prefetch_device': 2, 'data_dir': None, 'manual_dir': None,
          **extra}


def get_config():
  config = ml_collections.ConfigDict()
  evaluation = f'decode|resize(128)|value_range(-1,1)|{LABELS}'
  config.dataset = ml_collections.ConfigDict({
      'train': _variant('train[:98%]',
                        f'decode|inception_crop(128)|flip_lr|value_range(-1,1)|{LABELS}',
                        shuffle_buffer=50_000),
      'val': _variant('train[98%:]', evaluation, cache='batched'),
      'test': _variant('test', evaluation, cache='batched'),
  })
  config.loss = ml_collections.ConfigDict({'name': 'ensemble_softmax_xent',
                                           'ensemble_size': MEMBERS})
  config.description = 'E3-S/32, K=1, M=2, Last 2'
  config.train_steps = 2000
  config.initialization = ml_collections.ConfigDict({
      'name': 'initialize_from_vmoe',
      'prefix': '/ckpts/eee_s32_last2_ilsvrc2012',
      'rules': [('head', ''),
                ('^(.*/pos_embedding)$', r'params/\1', 'vit_zoom'),
                ('^(.*/Moe/Router/dense/.*)$', r'params/\1', 'reshape'),
                ('^(.*)$', r'params/\1')],
      'raise_if_target_unmatched': False,
      'axis_resources_regexes': [('Moe/Mlp/.*', ('expert',))],
  })
  router = {'num_selected_experts': 1, 'noise_std': 1.0, 'importance_loss_weight': 0.005,
            'load_loss_weight': 0.005,
            'dispatcher': {'name': 'einsum', 'bfloat16': True, 'capacity_factor': 1.5,
                           'partition_spec': (('expert', 'replica'),),
                           'batch_priority': False}}
  config.model = ml_collections.ConfigDict({
      'name': 'VisionTransformerMoeEnsemble', 'num_classes': CLASSES, 'patch_size': (32, 32),
      'hidden_size': 512, 'classifier': 'token', 'representation_size': 512,
      'head_bias_init': -10.0,
      'encoder': {'num_layers': 8, 'num_heads': 8, 'mlp_dim': 2048, 'dropout_rate': 0.0,
                  'attention_dropout_rate': 0.0,
                  'moe': {'ensemble_size': MEMBERS, 'num_experts': 8,
                          'group_size': (1024 // 8) * TOKENS * MEMBERS, 'layers': (5, 7),
                          'dropout_rate': 0.0, 'split_rngs': False, 'router': router}},
  })
  config.optimizer = ml_collections.ConfigDict({
      'name': 'sgd', 'momentum': 0.9, 'accumulator_dtype': 'float32',
      'learning_rate': {'schedule': 'warmup_cosine_decay', 'peak_value': 0.005,
                        'end_value': 1e-5, 'warmup_steps': 200},
      'gradient_clip': {'global_norm': 10.0},
  })
  config.num_expert_partitions = 8
  config.params_axis_resources = [('Moe/Mlp/.*', ('expert',))]
  config.extra_rng_keys = ('dropout', 'gating')
  config.save_checkpoint = ml_collections.ConfigDict({'every_steps': 1000, 'keep_last': 1,
                                                      'wait_seconds': 300})
  config.report_progress = ml_collections.ConfigDict({'every_secs': None, 'every_steps': 100})
  config.evaluate = ml_collections.ConfigDict({'every_steps': 100})
  config.profile = ml_collections.ConfigDict({'all_processes': False, 'num_profile_steps': 5,
                                              'first_profile': 10, 'every_secs': 3600.0})
  config.seed = 0
  return config
