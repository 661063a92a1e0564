"""Training config layout, `key=value` config-file arguments, and validation.

Config files in `configs/` start from `base_config()` (which lists every key the
trainer reads, with defaults) and return it locked, so a typo'd key fails instead
of being silently ignored. Kept free of JAX and TensorFlow: config files import
this module, and so does the command line before anything heavy is loaded.
"""
from __future__ import annotations

import importlib.util
import re
from typing import Any, Mapping, Sequence

import ml_collections

from vmoe_sparse_ot.evaluate.config import default_fewshot_config
from vmoe_sparse_ot.evaluate.config import transfer_datasets
from vmoe_sparse_ot.nn.config import VIT_SIZES
from vmoe_sparse_ot.nn.config import default_model_config

OPTIMIZERS = ('adam', 'adamw', 'sgd')
SCHEDULES = ('warmup_linear_decay', 'warmup_cosine_decay', 'warmup_constant')
MESH_AXES = ('data', 'expert')


def base_config() -> ml_collections.ConfigDict:
  """Every key the trainer reads, with defaults (unlocked; config files lock it)."""
  return ml_collections.ConfigDict({
      'model': default_model_config(),
      'dataset': {
          # An embedded dataset ('embedded_mnist', 'sklearn_digits') or a prepared
          # TFDS name (e.g. 'imagenet2012' under `data_dir`).
          'name': 'embedded_mnist',
          'train_split': 'train',
          'eval_split': 'test',
          'image_size': 28,
          'channels': 1,
          'data_dir': ml_collections.FieldReference(None, field_type=str),
          'shuffle_buffer': 10_000,
          # 'none' or 'inception_crop_flip'; None: by dataset (none for digits).
          'augment': ml_collections.FieldReference(None, field_type=str),
      },
      # Global batch sizes (over all processes); each process reads its share.
      'batch_size': 64,
      'eval_batch_size': 256,
      'train_steps': 1000,
      'optimizer': {
          # 'adam' / 'adamw': Adam with decoupled weight decay (AdamW), the decay
          # scaled by the learning rate schedule as in V-MoE; 'sgd': momentum SGD.
          'name': 'adam',
          'b1': 0.9,
          'b2': 0.999,
          'eps': 1e-8,
          'momentum': 0.9,
          'weight_decay': 0.0,
          # Parameters whose '/'-joined path matches get weight decay.
          'weight_decay_regex': r'(^|/)[^/]*kernel$',
          # Clip gradients to this global norm; None: no clipping.
          'gradient_clip_norm': ml_collections.FieldReference(None, field_type=float),
      },
      'schedule': {
          'name': 'warmup_linear_decay',
          'peak_value': 1e-3,
          'end_value': 1e-5,
          'warmup_steps': 100,
          # Steps from the end of warmup to `end_value`; None: until train_steps.
          'decay_steps': ml_collections.FieldReference(None, field_type=int),
      },
      'mesh': {
          # Devices along 'expert' (expert parameters are split over it); -1: the
          # largest count dividing both the devices and the experts. 'data' takes
          # the remaining devices when -1. The batch is split over both axes.
          'data': -1,
          'expert': 1,
      },
      'checkpoint': {
          'every_steps': 500,
          'keep': 2,
          'async_save': True,
      },
      'log_every_steps': 50,
      # 0 disables periodic evaluation; the final step is always evaluated.
      'eval_every_steps': 500,
      'fewshot': default_fewshot_config(),
      'seed': 0,
  })


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """Parses a config-file argument 'k1=v1,k2=v2' over `defaults` (types follow them).

  `--config=configs/vmoe_tiny_mnist.py:router=sbase,steps=100` reaches
  `get_config('router=sbase,steps=100')`. Unknown keys fail with the valid ones.
  """
  out = ml_collections.ConfigDict(defaults)
  if not arg:
    return out
  for item in arg.split(','):
    if '=' not in item:
      raise ValueError(f'config argument {item!r} is not key=value; valid keys: '
                       f'{sorted(defaults)}')
    key, value = (s.strip() for s in item.split('=', 1))
    if key not in defaults:
      raise ValueError(f'unknown config argument {key!r}; valid keys: {sorted(defaults)}')
    default = defaults[key]
    if isinstance(default, bool):
      out[key] = value.lower() in ('1', 'true', 'yes')
    elif isinstance(default, (int, float)):
      out[key] = type(default)(value)
    else:
      out[key] = value
  return out


def validate(config: Mapping[str, Any]) -> None:
  """Checks the trainer's own sections; the model checks its own in nn.build_model."""
  _check_keys(config, base_config(), 'config')
  for section in ('dataset', 'optimizer', 'schedule', 'mesh', 'checkpoint'):
    _check_keys(config[section], base_config()[section], f'config.{section}')
  if config['optimizer']['name'] not in OPTIMIZERS:
    raise ValueError(f"config.optimizer.name must be one of {list(OPTIMIZERS)}, "
                     f"got {config['optimizer']['name']!r}")
  if config['schedule']['name'] not in SCHEDULES:
    raise ValueError(f"config.schedule.name must be one of {list(SCHEDULES)}, "
                     f"got {config['schedule']['name']!r}")
  for key in ('batch_size', 'eval_batch_size', 'train_steps'):
    if int(config[key]) <= 0:
      raise ValueError(f'config.{key} must be positive, got {config[key]}')
  if config['dataset']['channels'] not in (1, 3):
    raise ValueError(f"config.dataset.channels must be 1 or 3, got {config['dataset']['channels']}")
  if int(config['checkpoint']['every_steps']) <= 0:
    raise ValueError('config.checkpoint.every_steps must be positive')
  re.compile(config['optimizer']['weight_decay_regex'])


def flatten(tree: Mapping[str, Any], prefix: str = '') -> dict[str, Any]:
  """{'a.b.c': leaf} of a nested dict (tuples become lists, as JSON returns them)."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = list(value) if isinstance(value, tuple) else value
  return out


def _check_keys(cfg: Mapping[str, Any], reference: Mapping[str, Any], where: str) -> None:
  unknown = sorted(set(cfg.keys()) - set(reference.keys()))
  if unknown:
    raise ValueError(f'unknown key(s) {unknown} in {where}; valid keys: {sorted(reference)}')


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """Loads 'path/to/config.py[:arg]' the way `config_flags` does."""
  path, _, arg = spec.partition(':')
  module_spec = importlib.util.spec_from_file_location('_vmoe_config', path)
  if module_spec is None:
    raise FileNotFoundError(f'config file {path!r} not found')
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def explain_override(config: Mapping[str, Any], overrides: Sequence[str]) -> str | None:
  """For '--config.a.b=v' overrides, names the first unknown key and the valid ones."""
  for override in overrides:
    path = override.split('=', 1)[0][len('--config.'):]
    node, walked = config, []
    for part in path.split('.'):
      if not hasattr(node, "keys") or part not in node.keys():
        where = '.'.join(['config', *walked])
        valid = sorted(node.keys()) if hasattr(node, "keys") else []
        return (f'Unknown config key {part!r} in {override.split("=", 1)[0]}; valid keys '
                f'under {where}: {", ".join(valid) if valid else "(none: it is a value)"}')
      node = node[part]
      walked.append(part)
  return None


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

  ViT sizes from `nn.config.VIT_SIZES`, written out as keys (model.variant stays
  None) so that the config shows them and overrides can shrink them. `arg` takes
  router=..., dataset=imagenet2012|imagenet21k, data_dir=... .
  """
  args = parse_arg(arg, router='sparse_ot', dataset='imagenet2012', data_dir='')
  image_size = 224
  if args.dataset not in PAPER_DATASETS:
    raise ValueError(f'dataset={args.dataset!r}; valid: {sorted(PAPER_DATASETS)}')
  hidden, layers, heads, mlp = VIT_SIZES[variant]
  config = base_config()
  m = config.model
  m.name = 'vit_moe'
  m.num_classes = PAPER_DATASETS[args.dataset]
  m.patch_size = (patch, patch)
  m.hidden_size = hidden
  m.classifier = 'token'
  m.representation_size = hidden
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
