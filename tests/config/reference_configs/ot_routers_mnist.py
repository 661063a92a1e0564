"""A small V-MoE on MNIST routed by one of the sparsity-constrained OT paper's routers, in
the reference V-MoE code's config layout: `:ARG` names the router (ksparse_ec,
ksparse_tc, l2, kl_tc, kl_ec), which the file gives by its dotted path with the options
that router reads there.

Written for the tests from that layout's documentation, not copied from any of its
files; it imports nothing of the reference.
"""
import ml_collections

PROJECT = 'vmoe.projects.sparsity_constrained_ot.'
ROUTERS = {
    'ksparse_ec': {
        'name': PROJECT + 'ksparse_projection_routing.'
                'KSparseProjectionTransportTopItemsPerExpertRouter',
        'maxiter': 30, 'adam_lr': 0.05, 'use_softmax_combine_weights': False},
    'ksparse_tc': {
        'name': PROJECT + 'ksparse_projection_routing.'
                'KSparseProjectionTransportTopExpertsPerItemRouter',
        'num_selected_experts': 2, 'adam_lr': 0.02},
    'l2': {
        'name': PROJECT + 'sparse_projection_routing.'
                'SparseProjectionTransportTopItemsPerExpertRouter',
        'maxiter': 10, 'use_softmax_combine_weights': False},
    'kl_tc': {
        'name': PROJECT + 'kl_projection_routing.KLProjectionNoisyTopExpertsPerItemRouter',
        'num_selected_experts': 2, 'use_lbfgs': True, 'importance_loss_weight': 0.01,
        'noise_std': 0.5},
    'kl_ec': {
        'name': PROJECT + 'kl_projection_routing.KLProjectionNoisyTopItemsPerExpertRouter',
        'maxiter': 5, 'use_implicit_differentiation': False},
}
LABELS = 'onehot(10, inkey="label", outkey="labels")|keep("image", "labels")'


def get_config(arg):
  config = ml_collections.ConfigDict()
  process = f'decode|resize(32)|value_range(-1,1)|{LABELS}'
  config.dataset = ml_collections.ConfigDict({
      'train': {'name': 'mnist', 'split': 'train', 'batch_size': 64, 'process': process},
      'test': {'name': 'mnist', 'split': 'test', 'batch_size': 128, 'process': process},
  })
  config.loss = ml_collections.ConfigDict({'name': 'softmax_xent'})
  config.train_steps = 100
  router = dict(ROUTERS[arg])
  router['dispatcher'] = {'name': 'einsum', 'capacity_factor': 1.0}
  config.model = ml_collections.ConfigDict({
      'name': 'VisionTransformerMoe', 'num_classes': 10, 'patch_size': (8, 8),
      'hidden_size': 32, 'classifier': 'token', 'representation_size': None,
      'encoder': {
          'num_layers': 2, 'mlp_dim': 64, 'num_heads': 2,
          'dropout_rate': 0.0, 'attention_dropout_rate': 0.0,
          'moe': {'num_experts': 4, 'layers': (1,), 'group_size': 34, 'router': router},
      },
  })
  config.optimizer = ml_collections.ConfigDict({
      'name': 'adam', 'b1': 0.9, 'b2': 0.999,
      'learning_rate': {'schedule': 'warmup_linear_decay', 'peak_value': 1e-3,
                        'end_value': 1e-5, 'warmup_steps': 10},
  })
  return config
