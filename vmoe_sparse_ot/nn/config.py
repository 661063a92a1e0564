"""Default model configuration: every key a model or router accepts, with defaults.

Configs in `configs/` start from `default_model_config()` and override what they
need, so a locked ConfigDict rejects typos while every router option stays
reachable from the command line (`--config.model.encoder.moe.router.name=sbase`).
"""
import ml_collections


def default_router_config() -> ml_collections.ConfigDict:
  """All router options. Each router reads the common keys plus its own sub-dict."""
  return ml_collections.ConfigDict({
      # One of: 'topk', 'sbase', 'sparse_ot', 'expert_choice'.
      'name': 'topk',
      # K: experts per token (topk, sbase, sparse_ot token-choice form).
      'num_selected_experts': 2,
      # C = ceil(S * K * capacity_factor / E), rounded up to a multiple of 4,
      # unless `capacity` is set, in which case it is used as is.
      'capacity_factor': 1.0,
      'capacity': ml_collections.FieldReference(None, field_type=int),
      # Gate noise std during training; None means 1/E (V-MoE).
      'noise_std': ml_collections.FieldReference(None, field_type=float),
      # Batch-prioritized routing (V-MoE): tokens with larger gates claim capacity first.
      'batch_priority': False,
      'importance_loss_weight': 0.005,
      'load_loss_weight': 0.005,
      'sbase': {
          'epsilon': 1.0,
          'num_iters': 20,
      },
      'sparse_ot': {
          # 'expert_choice': at most k=C tokens per expert (the paper's form);
          # 'token_choice': at most K experts per token.
          'form': 'expert_choice',
          'solver': 'adam',
          'num_steps': 50,
          'learning_rate': 1e-2,
          'gamma': 1.0,
          # 'fast': the router's batched Adam (nn/sparse_ot_solver.py, same
          # iterates as ot.solve, several times faster on CPU); 'reference':
          # jax.vmap(ot.solve). L-BFGS always uses ot.solve.
          'implementation': 'fast',
      },
  })


# (hidden_size, num_layers, num_heads, mlp_dim) of the ViT sizes (Dosovitskiy et al.).
VIT_SIZES = {
    'Ti': (192, 12, 3, 768),
    'S': (384, 12, 6, 1536),
    'B': (768, 12, 12, 3072),
    'L': (1024, 24, 16, 4096),
    'H': (1280, 32, 16, 5120),
}


def default_model_config() -> ml_collections.ConfigDict:
  """A small V-MoE; the paper's B/32 and B/16 override sizes in `configs/`."""
  return ml_collections.ConfigDict({
      # 'vit_moe' (MoE layers placed by encoder.moe.layers) or 'vit' (dense ViT).
      'name': 'vit_moe',
      # Optional ViT size 'S/32', 'B/16', 'L/14', ... (sizes Ti, S, B, L, H;
      # any patch): overrides hidden_size, encoder.num_layers/num_heads/mlp_dim
      # and patch_size. None: use those keys as set.
      'variant': ml_collections.FieldReference(None, field_type=str),
      'num_classes': 10,
      'patch_size': (4, 4),
      'hidden_size': 64,
      # 'token' (class token) or 'gap' (global average pooling).
      'classifier': 'token',
      'representation_size': ml_collections.FieldReference(None, field_type=int),
      'head_bias_init': 0.0,
      'encoder': {
          'num_layers': 4,
          'num_heads': 4,
          'mlp_dim': 128,
          'dropout_rate': 0.0,
          'attention_dropout_rate': 0.0,
          'moe': {
              # 'every_2' (blocks 1, 3, 5, ...), 'last_N' (e.g. 'last_2'), or a
              # comma-separated explicit list of block indices such as '1,3'.
              'layers': 'every_2',
              'num_experts': 8,
              # S: tokens per routing group.
              'group_size': 64,
              # 'indices' (gather/scatter, default, fast) or 'einsum'.
              'dispatcher': 'indices',
              'router': default_router_config(),
          },
      },
  })
