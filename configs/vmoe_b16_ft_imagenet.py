"""Fine-tune the released V-MoE B/16 (ImageNet-21k upstream) on ILSVRC2012 at 384 px.

The reference V-MoE fine-tuning recipe for its released
`vmoe_b16_imagenet21k_randaug_strong` checkpoint (ViT-B/16, E=8, K=2, Every-2,
pre-trained at 224 px on ImageNet-21k; the reference reports 89.2% / 85.6% on
ILSVRC2012 val / test after fine-tuning):
- the model at 384 px: 24 x 24 patches + class token, groups of 8 images
  (S = 8 x 577 = 4616 tokens), capacity factor 1.5, no representation layer;
- SGD with momentum 0.9, peak learning rate 0.003 after 500 warmup steps, cosine
  decay to 1e-5, gradient clipping at global norm 10, 10,000 steps at batch 1024,
  no weight decay;
- initialized from the released checkpoint: its 21,843-class head is replaced by
  a zero-initialized 1000-class one, and the 14 x 14 position embedding is
  resized to 24 x 24 (both by `initialization`'s defaults; the log says so);
- training data `train[:99%]`, preprocessed as the reference does:
  `decode_jpeg_and_inception_crop(384)|flip_lr|value_range(-1, 1)` (crops of 5-100%
  of the area); evaluation on `validation`, `decode|resize(384)|value_range(-1, 1)`.

  --config=configs/vmoe_b16_ft_imagenet.py:init=/ckpts/vmoe_b16_imagenet21k_randaug_strong,data_dir=/data/tfds

`init` is the checkpoint prefix (PREFIX.index + PREFIX.data-*; download it
yourself: nothing is fetched at run time), a workdir of this project or an .npz.
Other arguments: router= (default topk, the released model's), steps=.

Differences from the reference recipe: the data is read from one TFDS dataset
(imagenet2012) under data_dir, and the loss reads the integer labels (the
reference one-hot encodes them; the same softmax cross-entropy).
Needs accelerators; on CPU it builds and passes a one-step dry run with shrunken
sizes (tests/train/test_recipes.py).
"""
import ml_collections

from vmoe_sparse_ot import config as config_lib

IMAGE_SIZE, PATCH, BATCH_SIZE = 384, 16, 1024


# The reference's training and evaluation preprocessing; they follow dataset.image_size.
PP_TRAIN = 'decode_jpeg_and_inception_crop({image_size})|flip_lr|value_range(-1, 1)'
PP_EVAL = 'decode|resize({image_size})|value_range(-1, 1)'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, init='', router='topk', steps=10_000, data_dir='')
  config = config_lib.base_config()
  m = config.model
  m.name, m.num_classes, m.classifier = 'vit_moe', 1000, 'token'
  m.patch_size, m.hidden_size, m.representation_size = (PATCH, PATCH), 768, None
  m.encoder.num_layers, m.encoder.num_heads, m.encoder.mlp_dim = 12, 12, 3072
  m.encoder.moe.layers, m.encoder.moe.num_experts = 'every_2', 8
  m.encoder.moe.group_size = 8 * ((IMAGE_SIZE // PATCH) ** 2 + 1)
  m.encoder.moe.dispatcher, m.encoder.moe.routed_tokens_dtype = 'einsum', 'bfloat16'
  m.encoder.moe.router.name = args.router
  m.encoder.moe.router.num_selected_experts = 2
  m.encoder.moe.router.capacity_factor = 1.5
  d = config.dataset
  d.name, d.train_split, d.eval_split = 'imagenet2012', 'train[:99%]', 'validation'
  d.image_size, d.channels = IMAGE_SIZE, 3
  d.pp_train = config_lib.pp_template(d, PP_TRAIN)
  d.pp_eval = config_lib.pp_template(d, PP_EVAL)
  d.shuffle_buffer, d.data_dir = 50_000, args.data_dir or None
  config.initialization.path = args.init or None
  config.batch_size = config.eval_batch_size = BATCH_SIZE
  config.train_steps = args.steps
  config.optimizer.name, config.optimizer.momentum = 'sgd', 0.9
  config.optimizer.weight_decay = 0.0
  config.optimizer.gradient_clip_norm = 10.0
  config.schedule.name, config.schedule.peak_value = 'warmup_cosine_decay', 0.003
  config.schedule.end_value, config.schedule.warmup_steps = 1e-5, 500
  config.mesh.expert = -1
  config.checkpoint.every_steps, config.log_every_steps = 1000, 100
  config.eval_every_steps = 1000
  config.fewshot.every_steps = 0
  config.lock()
  return config
