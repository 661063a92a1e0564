"""Tiny Soft MoE on the embedded MNIST, with the model options of the Soft MoE recipe.

  --config=configs/softmoe_tiny_mnist.py                  # 1500 steps
  --config=configs/softmoe_tiny_mnist.py:steps=200
  --config=configs/softmoe_tiny_mnist.py:position_emb=sincos2d

The reference code's Soft MoE configs (vmoe/projects/soft_moe/configs/common.py,
get_vmoe_soft_router_config) at the size of configs/vmoe_tiny_mnist.py: ViT with
4 blocks (D=64, MLP 128, 4 heads) on 28x28x1 images cut into 7x7 patches (16
tokens, no class token), with
- LayerNorm on the queries and keys (`attention_qk_norm`);
- global average pooling (`classifier='gap'`), no pre-logits layer;
- head bias -log(10), with the sigmoid cross-entropy, as the recipe;
- MoE in the last 2 blocks (2 and 3, as its `layers=range(L)[-last_n:]`), 8 experts;
- the soft_moe router with `num_slots` (2 slots per expert: 16 slots for the 16
  tokens of an image, one group per image as there, `group_size=(28 // 7) ** 2`);
- its optimizer's shape: Adam, weight decay 3.0 on the head kernel and 0.03 on
  the other kernels and on the router's scale, gradient clipping at 1.0 (with
  this project's tiny config's schedule, at 1500 steps).
Position embeddings are learned, the recipe's default; `position_emb=sincos2d`
or `none` picks the others.
"""
import math

import ml_collections

from vmoe_sparse_ot import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, steps=1500, position_emb='learned')
  config = config_lib.base_config()
  m = config.model
  m.name = 'vit_moe'
  m.num_classes = 10
  m.patch_size = (7, 7)
  m.hidden_size = 64
  m.classifier = 'gap'
  m.head_bias_init = -math.log(10)
  m.encoder.num_layers = 4
  m.encoder.num_heads = 4
  m.encoder.mlp_dim = 128
  m.encoder.attention_qk_norm = True
  m.encoder.position_emb = args.position_emb
  m.encoder.moe.layers = '2,3'
  m.encoder.moe.num_experts = 8
  m.encoder.moe.group_size = (28 // 7) ** 2
  m.encoder.moe.router.name = 'soft_moe'
  m.encoder.moe.router.soft_moe.num_slots = 2
  config.dataset.name = 'embedded_mnist'
  config.dataset.train_split = 'train'
  config.dataset.eval_split = 'test'
  config.dataset.image_size = 28
  config.dataset.channels = 1
  # The sigmoid cross-entropy needs one-hot float targets 'labels'.
  pp = ('decode(channels={channels})|resize({image_size})|value_range(-1, 1)|'
        "onehot(10, key='label', key_result='labels')")
  config.dataset.pp_train = config_lib.pp_template(config.dataset, pp)
  config.dataset.pp_eval = config_lib.pp_template(config.dataset, pp)
  config.loss.name = 'sigmoid_xent'
  config.batch_size = 128
  config.eval_batch_size = 500
  config.train_steps = args.steps
  config.optimizer.name = 'adam'
  config.optimizer.weight_decay = [('head/kernel', 3.0), ('.*/kernel', 0.03),
                                   ('.*/moe/router/scale', 0.03)]
  config.optimizer.gradient_clip_norm = 1.0
  config.schedule.name = 'warmup_cosine_decay'
  config.schedule.peak_value = 3e-3
  config.schedule.end_value = 1e-5
  config.schedule.warmup_steps = 100
  config.checkpoint.every_steps = 300
  config.log_every_steps = 100
  config.eval_every_steps = 500
  config.fewshot.every_steps = 0
  config.fewshot.shots = (1, 5, 10)
  config.fewshot.seeds = (0, 1, 2)
  config.lock()
  return config
