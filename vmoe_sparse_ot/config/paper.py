"""The paper's V-MoE B/32 and B/16 training recipe (`configs/vmoe_b32.py`, `vmoe_b16.py`)."""
from __future__ import annotations

import ml_collections

from vmoe_sparse_ot.config.fewshot_section import transfer_datasets
from vmoe_sparse_ot.nn.model_config import variant_sizes
from vmoe_sparse_ot.config.files import parse_arg
from vmoe_sparse_ot.config.schema import base_config

# TFDS names with their label counts. ImageNet-21k is not registered in TFDS 4.9
# (the V-MoE authors used their own builder); a user-registered one works as is.
PAPER_DATASETS = {'imagenet2012': 1000, 'imagenet21k': 21_843}
# The V-MoE JFT-300M recipe for B/32 and B/16: 7 epochs of 305M images at batch 4096.
PAPER_BATCH_SIZE = 4096
PAPER_TRAIN_STEPS = 7 * 305_000_000 // PAPER_BATCH_SIZE


def paper_vmoe_config(variant: str, patch: int, arg: str | None) -> ml_collections.ConfigDict:
  """V-MoE {variant}/{patch} as in the paper's Appendix A.5, on the V-MoE recipe.

  From the paper (Appendix A.5, "V-MoE architecture"): Every-2 MoE layers,
  E = 32 experts, K = 2 experts per token for TopK and S-BASE, k = 16 nonzeros
  per expert column for sparse_ot (which is then also its buffer size); Adam
  for 50 steps at learning rate 1e-2 for the router's semi-dual ("The
  Sparsity-constrained router").

  From V-MoE (Riquelme et al. 2021) and its released configs, which the paper
  follows for everything else: routing groups of 8 images, S = 8 x (tokens per
  image) = 8 x 50 = 400 at 224px for B/32 (8 x 197 = 1576 for B/16); capacity
  factor 1.05, so C = ceil(S K 1.05 / E) rounded up to a multiple of 4 = 28 for
  B/32 (104 for B/16); the einsum dispatcher in bfloat16; gate noise 1/E and
  importance and load loss weights 0.005 (the router defaults); token
  classifier with a representation layer of size D; Adam (b1 0.9, b2 0.999)
  with decoupled weight decay 0.1, 10k warmup steps then linear decay to 1e-5,
  peak learning rate 8e-4 (V-MoE Table 8 for B/32, B/16); global batch 4096,
  224x224 inputs with inception crop and flip.

  Sizes of `model.variant='V-MoE-{variant}/{patch}'` (`nn.model_config.variant_sizes`;
  V-MoE B is ViT-B), written out as keys (model.variant stays None) so that the
  config shows them and overrides can shrink them. `arg` takes
  router=..., dataset=imagenet2012|imagenet21k, data_dir=... .
  """
  args = parse_arg(arg, router='sparse_ot', dataset='imagenet2012', data_dir='')
  image_size = 224
  if args.dataset not in PAPER_DATASETS:
    raise ValueError(f'dataset={args.dataset!r}; valid: {sorted(PAPER_DATASETS)}')
  sizes = variant_sizes(f'V-MoE-{variant}/{patch}')
  hidden, layers = sizes['hidden_size'], sizes['num_layers']
  heads, mlp = sizes['num_heads'], sizes['mlp_dim']
  config = base_config()
  m = config.model
  m.name = 'vit_moe'
  m.num_classes = PAPER_DATASETS[args.dataset]
  m.patch_size = (patch, patch)
  m.hidden_size = hidden
  m.classifier = 'token'
  m.representation_size = sizes['representation_size']   # D, as the V-MoE configs
  m.encoder.num_layers = layers
  m.encoder.mlp_dim = mlp
  m.encoder.num_heads = heads
  m.encoder.moe.layers = 'every_2'
  m.encoder.moe.num_experts = 32
  # V-MoE: groups of 8 images (tokens per image: patches + class token).
  m.encoder.moe.group_size = 8 * ((image_size // patch) ** 2 + 1)
  m.encoder.moe.dispatcher = 'einsum'
  m.encoder.moe.routed_tokens_dtype = 'bfloat16'
  m.encoder.moe.router.name = args.router
  m.encoder.moe.router.num_selected_experts = 2
  m.encoder.moe.router.capacity_factor = 1.05
  m.encoder.moe.router.capacity = None
  m.encoder.moe.router.sparse_ot.k = 16
  m.encoder.moe.router.sparse_ot.form = 'expert_choice'
  m.encoder.moe.router.sparse_ot.solver = 'adam'
  m.encoder.moe.router.sparse_ot.num_steps = 50
  m.encoder.moe.router.sparse_ot.learning_rate = 1e-2
  d = config.dataset
  d.name = args.dataset
  d.train_split = 'train' if args.dataset == 'imagenet2012' else 'full[102400:]'
  d.eval_split = 'validation' if args.dataset == 'imagenet2012' else 'full[:102400]'
  d.image_size = image_size
  d.channels = 3
  d.augment = 'inception_crop_flip'
  d.shuffle_buffer = 250_000
  d.data_dir = args.data_dir or None
  config.batch_size = PAPER_BATCH_SIZE
  config.eval_batch_size = PAPER_BATCH_SIZE
  config.train_steps = PAPER_TRAIN_STEPS
  config.optimizer.name = 'adam'
  config.optimizer.b1, config.optimizer.b2 = 0.9, 0.999
  config.optimizer.weight_decay = 0.1
  config.schedule.name = 'warmup_linear_decay'
  config.schedule.peak_value = 8e-4
  config.schedule.end_value = 1e-5
  config.schedule.warmup_steps = 10_000
  config.mesh.expert = -1
  config.checkpoint.every_steps = 1000
  config.checkpoint.keep = 2
  config.log_every_steps = 100
  config.eval_every_steps = 1000
  # The paper reports ImageNet 10-shot linear transfer.
  config.fewshot.datasets = transfer_datasets('imagenet')
  config.fewshot.shots = (10,)
  config.fewshot.every_steps = 10_000
  config.lock()
  return config
