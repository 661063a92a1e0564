"""Default model configuration: every key a model or router accepts, with defaults.

Configs in `configs/` start from `default_model_config()` and override what they
need, so a locked ConfigDict rejects typos while every router option stays
reachable from the command line (`--config.model.encoder.moe.router.name=sbase`).
The model's own option checks (`check_model_options`, `variant_sizes`) live here
too: `nn.build_model` and config validation both call them.
"""
import copy
import dataclasses
import typing

import ml_collections

from vmoe_sparse_ot.nn import ensemble
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.routers.base import OptionError
from vmoe_sparse_ot.nn.vit import CLASSIFIERS, POSITION_EMBS

MODELS = ('vit_moe', 'vit')
# CLASSIFIERS: 'token' (class token), 'gap' (global average pooling), 'map'
# (attention pooling, nn.vit.MapHead) or '0' (the first token, no class token).
# POSITION_EMBS: 'learned', 'sincos2d' or 'none'.


def _config_value(value, annotation):
  """A ConfigDict leaf: None defaults keep their type for command-line overrides."""
  if value is None:
    inner = next(a for a in typing.get_args(annotation) if a is not type(None))
    return ml_collections.FieldReference(None, field_type=inner)
  return value


def default_router_config() -> ml_collections.ConfigDict:
  """Every router option with its default, derived from the routers' options dataclasses.

  `name` picks the router (`nn.routers.ROUTERS`); options shared by routers sit
  at the top level, each router's own options in a sub-dict named after it. The
  options' meanings are documented on the dataclasses in `nn/routers/`.
  """
  types = {}
  for r in routers.ROUTERS.values():
    hints = typing.get_type_hints(r.options)
    top = routers.base.top_level_fields(r.options)
    for f in dataclasses.fields(r.options):
      types[(None if f.name in top else r.name, f.name)] = hints[f.name]
  out = {}
  for key, value in routers.default_config().items():
    if isinstance(value, dict):
      out[key] = {k: _config_value(v, types[(key, k)]) for k, v in value.items()}
    else:
      out[key] = _config_value(value, types.get((None, key), str))
  return ml_collections.ConfigDict(out)


# (hidden_size, num_layers, num_heads, mlp_dim) of the ViT sizes (Dosovitskiy et al.).
VIT_SIZES = {
    'Ti': (192, 12, 3, 768),
    'S': (384, 12, 6, 1536),
    'B': (768, 12, 12, 3072),
    'L': (1024, 24, 16, 4096),
    'H': (1280, 32, 16, 5120),
}
# The same for the V-MoE sizes (Riquelme et al. 2021, as the reference V-MoE configs
# set them). Only S differs from ViT's: the V-MoE S has 8 blocks of D 512.
VMOE_SIZES = {
    'S': (512, 8, 8, 2048),
    'B': (768, 12, 12, 3072),
    'L': (1024, 24, 16, 4096),
    'H': (1280, 32, 16, 5120),
}
VMOE_PREFIX = 'V-MoE-'
# model.dtype: the activations' dtype (None: float32; parameters stay float32).
MODEL_DTYPES = ('float32', 'bfloat16')
# model keys that change how the model computes (precision, memory), not its
# parameters or its function: a checkpoint resumes and is evaluated under any
# values of them, and checkpoints written before they existed lack them.
COMPUTE_KEYS = ('dtype', 'remat')
COMPUTE_DEFAULTS = {'dtype': None, 'remat': False}


# Keys added after checkpoints recorded model configs, with their defaults: a
# record leaves them out at these values, and a record without them means these
# values, so workdirs written before they existed still resume and evaluate.
LATER_DEFAULTS = {
    ('encoder', 'moe', 'dropout_rate'): None,
    ('encoder', 'moe', 'router', 'capacity_ceil_or_round'): 'ceil',
    ('encoder', 'moe', 'router', 'capacity_multiple_of'): 4,
    ('encoder', 'attention_qk_norm'): False,
    ('encoder', 'position_emb'): 'learned',
    ('head_kernel_zero_init',): True,
    ('encoder', 'moe', 'router', 'soft_moe', 'num_slots'): None,
    ('encoder', 'moe', 'router', 'soft_moe', 'compute_similarity_metrics'): False,
    ('ensemble_size',): 1,
    ('encoder', 'moe', 'router', 'sparse_ot', 'tol'): 1e-6,
}


# Router keys that choose how the router computes, not the model's parameters or
# its function: sparse_ot's implementation (the same plans up to rounding, see
# nn/routers/sparse_ot.py). Like COMPUTE_KEYS they are not compared when a
# checkpoint resumes or is evaluated: records from before 'auto' became the
# default hold 'fast', and resume under 'auto' (set 'fast' to continue
# bit-identically). Records keep them, so an evaluation with the checkpoint's
# config runs the path it trained with.
ROUTER_COMPUTE_KEYS = (('encoder', 'moe', 'router', 'sparse_ot', 'implementation'),)


def _without_router_compute_keys(model_config: dict) -> dict:
  for path in ROUTER_COMPUTE_KEYS:
    node = model_config
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict):
      node.pop(path[-1], None)
  return model_config


def _without_later_defaults(model_config: dict) -> dict:
  out = copy.deepcopy(model_config)
  for path, default in LATER_DEFAULTS.items():
    node = out
    for key in path[:-1]:
      node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and path[-1] in node and node[path[-1]] == default:
      del node[path[-1]]
  return out


def _with_resolved_solver_steps(model_config: dict) -> dict:
  """sparse_ot's num_steps=None as the count it means for its solver (10 for
  'newton', 50 for 'adam' and 'lbfgs'), so that a record from before None meant
  "the solver's default" (it held 50 with 'adam') compares equal to it."""
  node = model_config
  for key in ('encoder', 'moe', 'router', 'sparse_ot'):
    node = node.get(key) if isinstance(node, dict) else None
  if isinstance(node, dict) and node.get('num_steps', 0) is None:
    solver = node.get('solver', routers.sparse_ot.SparseOTOptions.solver)
    node['num_steps'] = routers.sparse_ot.num_steps(
        routers.sparse_ot.SparseOTOptions(solver=solver))
  return model_config


def without_compute_keys(model_config, *, only_defaults: bool = False) -> dict:
  """A copy of a model config dict without `COMPUTE_KEYS` (with `only_defaults`,
  only those at their defaults, so a record looks as it did before they existed),
  without the `LATER_DEFAULTS` keys at their defaults, and (without
  `only_defaults`: for comparisons) without `ROUTER_COMPUTE_KEYS`."""
  out = _without_later_defaults(
      {k: v for k, v in dict(model_config).items()
       if k not in COMPUTE_KEYS or (only_defaults and v != COMPUTE_DEFAULTS[k])})
  return out if only_defaults else _without_router_compute_keys(
      _with_resolved_solver_steps(out))


def variant_sizes(variant: str) -> dict:
  """The keys a `model.variant` sets: 'B/16' (ViT sizes) or 'V-MoE-S/32' (V-MoE sizes).

  Returns {hidden_size, num_layers, num_heads, mlp_dim, patch_size: (P, P),
  representation_size}: representation_size is D for V-MoE variants (the
  reference V-MoE configs' pre-logits layer), None for ViT ones. Raises
  `OptionError` naming `model.variant` and the accepted forms.
  """
  text = str(variant)
  vmoe = text.startswith(VMOE_PREFIX)
  sizes = VMOE_SIZES if vmoe else VIT_SIZES
  size, _, patch = text[len(VMOE_PREFIX) if vmoe else 0:].partition('/')
  if size not in sizes or not patch.isdigit() or int(patch) < 1:
    raise OptionError(
        'model.variant', variant,
        f'must be SIZE/PATCH with SIZE in {list(VIT_SIZES)} (e.g. "B/32"), '
        f'{VMOE_PREFIX}SIZE/PATCH with SIZE in {list(VMOE_SIZES)} (e.g. '
        f'"{VMOE_PREFIX}S/32") or None')
  hidden, layers, heads, mlp = sizes[size]
  return {'hidden_size': hidden, 'num_layers': layers, 'num_heads': heads, 'mlp_dim': mlp,
          'patch_size': (int(patch), int(patch)),
          'representation_size': hidden if vmoe else None}


def _flag(key: str, value) -> None:
  if not isinstance(value, bool):
    raise OptionError(key, value, 'must be True or False')


def num_prefix_tokens(model_config) -> int:
  """Tokens before the patches in the encoder: 1 (the class token) for classifier 'token'."""
  return int(model_config.get('classifier', 'token') == 'token')


def check_model_options(model_config) -> None:
  """The model's choices and flags: name, classifier, num_classes, position_emb,
  attention_qk_norm, head_kernel_zero_init, dtype, remat, encoder.moe.split_rngs.

  `model_config` is a dict like `default_model_config()`'s (missing keys take its
  defaults). Raises `OptionError` naming the first bad key. Sizes and the router
  are checked where they are read (`nn.build_model`, the routers' options).
  """
  name = model_config.get('name', 'vit_moe')
  if name not in MODELS:
    raise OptionError('model.name', name, f'must be one of {list(MODELS)}')
  classifier = model_config.get('classifier', 'token')
  if classifier not in CLASSIFIERS:
    raise OptionError('model.classifier', classifier, f'must be one of {list(CLASSIFIERS)}')
  num_classes = model_config.get('num_classes', 10)
  if num_classes is not None and (not isinstance(num_classes, int) or
                                  isinstance(num_classes, bool) or num_classes < 1):
    raise OptionError('model.num_classes', num_classes,
                      'must be an integer >= 1 or None (no head: the model returns its '
                      'representation)')
  encoder = model_config.get('encoder') or {}
  position_emb = encoder.get('position_emb', 'learned')
  if position_emb not in POSITION_EMBS:
    raise OptionError('model.encoder.position_emb', position_emb,
                      f'must be one of {list(POSITION_EMBS)}')
  if position_emb == 'sincos2d':
    hidden = model_config.get('hidden_size', 64)
    if model_config.get('variant') is not None:
      hidden = variant_sizes(model_config['variant'])['hidden_size']
    if isinstance(hidden, int) and (hidden % 4 or hidden < 8):
      raise OptionError('model.encoder.position_emb', position_emb,
                        f'needs model.hidden_size a multiple of 4 and >= 8 (it is {hidden})')
  _flag('model.encoder.attention_qk_norm', encoder.get('attention_qk_norm', False))
  _flag('model.head_kernel_zero_init', model_config.get('head_kernel_zero_init', True))
  dtype = model_config.get('dtype')
  if dtype is not None and dtype not in MODEL_DTYPES:
    raise OptionError('model.dtype', dtype, f'must be one of {list(MODEL_DTYPES)} or None')
  _flag('model.remat', model_config.get('remat', False))
  if name == 'vit_moe':
    _flag('model.encoder.moe.split_rngs',
          model_config['encoder']['moe'].get('split_rngs', False))
  check_ensemble_size(model_config)


def check_ensemble_size(model_config) -> None:
  """`model.ensemble_size` M (E³, `nn.ensemble`): an integer >= 1; M > 1 needs a
  'vit_moe' whose num_experts and group_size are multiples of M, at least K experts
  per member, and a router that `nn.ensemble.supports`."""
  key = 'model.ensemble_size'
  m = model_config.get('ensemble_size', 1)
  if not isinstance(m, int) or isinstance(m, bool) or m < 1:
    raise OptionError(key, m, 'must be an integer >= 1 (1: no ensemble)')
  if m == 1:
    return
  if model_config.get('name', 'vit_moe') != 'vit_moe':
    raise OptionError(key, m, "> 1 (E³) needs model.name='vit_moe'")
  moe = model_config['encoder']['moe']
  experts, group = moe.get('num_experts'), moe.get('group_size')
  if isinstance(experts, int) and experts % m:
    raise OptionError(key, m, f'must divide model.encoder.moe.num_experts ({experts})')
  if isinstance(group, int) and group % m:
    raise OptionError(key, m, f'must divide model.encoder.moe.group_size ({group}): each '
                      'group holds the same number of tokens of every member')
  router = moe.get('router') or {}
  k = router.get('num_selected_experts', 2)
  if isinstance(experts, int) and isinstance(k, int) and k > experts // m:
    raise OptionError(key, m, f'leaves {experts // m} experts per member, fewer than '
                      f'model.encoder.moe.router.num_selected_experts ({k})')
  name = router.get('name', 'topk')
  if name in routers.ROUTERS and not ensemble.supports(routers.ROUTERS[name]):
    raise OptionError(key, m, f'> 1 (E³) cannot route with router {name!r} (its own logits '
                      'layer or router state); use topk, sbase, sparse_ot, expert_choice '
                      'or sinkhorn_ec')


def default_model_config() -> ml_collections.ConfigDict:
  """A small V-MoE; the paper's B/32 and B/16 override sizes in `configs/`."""
  return ml_collections.ConfigDict({
      # 'vit_moe' (MoE layers placed by encoder.moe.layers) or 'vit' (dense ViT).
      'name': 'vit_moe',
      # Optional size: ViT's 'S/32', 'B/16', 'L/14', ... (Ti, S, B, L, H; any
      # patch) or V-MoE's 'V-MoE-S/32', 'V-MoE-B/16', ... (S, B, L, H; the V-MoE
      # S has 8 blocks of D 512). Overrides hidden_size, encoder.num_layers/
      # num_heads/mlp_dim and patch_size; a V-MoE variant also sets
      # representation_size to D unless it is set. None: use those keys as set.
      'variant': ml_collections.FieldReference(None, field_type=str),
      # None: no head; the model returns its representation (the pre-logits) in
      # place of the logits (a backbone; training needs a head).
      'num_classes': 10,
      'patch_size': (4, 4),
      'hidden_size': 64,
      # One of CLASSIFIERS.
      'classifier': 'token',
      # Size of the tanh pre-logits layer; None: none (a V-MoE variant: D);
      # 0: none, whatever the variant.
      'representation_size': ml_collections.FieldReference(None, field_type=int),
      'head_bias_init': 0.0,
      # True: the head kernel starts at zero; False: flax's default (LeCun normal).
      'head_kernel_zero_init': True,
      # dtype of the activations and matrix products: None (float32) or
      # 'bfloat16' (half the activation memory). Parameters stay float32;
      # LayerNorm, the attention softmax, the router and the head compute in
      # float32, and logits come back float32.
      'dtype': ml_collections.FieldReference(None, field_type=str),
      # Rematerialise each encoder block in the backward pass: only block inputs
      # are kept for it, for about one more forward pass of compute.
      'remat': False,
      # E³ (Efficient Ensembles of Experts): M members, each routing among its
      # own num_experts / M experts after the dense blocks; the members'
      # predictions are combined by the mean of their probabilities. 1: V-MoE.
      'ensemble_size': 1,
      'encoder': {
          'num_layers': 4,
          'num_heads': 4,
          'mlp_dim': 128,
          'dropout_rate': 0.0,
          'attention_dropout_rate': 0.0,
          # LayerNorm on each head's queries and keys before their dot product
          # (the Soft MoE recipe's; parameters query_ln/scale and key_ln/scale).
          'attention_qk_norm': False,
          # One of POSITION_EMBS: 'learned' (a parameter), 'sincos2d' (fixed 2-D
          # sine-cosine, temperature 10000; none on a class token) or 'none'.
          'position_emb': 'learned',
          'moe': {
              # As the reference V-MoE places them: 'every_N' (blocks N-1, 2N-1,
              # ...; 'every_2': 1, 3, 5, ...), 'last_N' (the last N of the every-2
              # blocks: 12 blocks, 'last_2' -> 9, 11), or a comma-separated explicit
              # list of block indices such as '1,3'.
              'layers': 'every_2',
              'num_experts': 8,
              # S: tokens per routing group.
              'group_size': 64,
              # 'indices' (gather/scatter, default, fast) or 'einsum'.
              'dispatcher': 'indices',
              # dtype of the data the dispatcher moves to the experts and back
              # (the routing weights stay float32, so the combine sums in float32):
              # None (the tokens' own), 'float32' or 'bfloat16' (as the reference's
              # Bfloat16Dispatcher).
              'routed_tokens_dtype': ml_collections.FieldReference(None, field_type=str),
              # As the reference V-MoE's option: False initializes every expert
              # alike (one draw, repeated) and shares dropout masks across experts;
              # True draws each expert's parameters and dropout independently.
              'split_rngs': False,
              # Dropout inside the experts' MLPs (after the GELU and after the
              # output projection, as the reference V-MoE's MlpMoeBlock
              # `dropout_rate`); None: encoder.dropout_rate, as the dense MLPs.
              'dropout_rate': ml_collections.FieldReference(None, field_type=float),
              'router': default_router_config(),
          },
      },
  })
