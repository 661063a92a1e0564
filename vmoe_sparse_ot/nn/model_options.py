"""The model's options, each defined once: its default, its doc and its check.

Three sections, as the config nests them: `ModelOptions` (`model`),
`EncoderOptions` (`model.encoder`) and `MoeOptions` (`model.encoder.moe`); the
router's options (`model.encoder.moe.router`) are the routers' own
(`nn.routers`). Each field is an `option(default, doc, check=...)`, from which
the rest derive:
- `nn.model_config.default_model_config()`: the defaults, in field order;
- the valid keys of each section (`keys`), for `check_keys`;
- `check_model_options`: every field's check plus the checks that span fields,
  which `nn.build_model` and config validation both call;
- `model_options(config)`: the checked values as these dataclasses, missing
  keys at their defaults: `nn.build_model`'s arguments.

A check is a function of the config value returning None when the value is
allowed, else what it must be ('must be an integer >= 1'); failures raise
`OptionError` naming the full key (`model.encoder.moe.num_experts must be an
integer >= 1, got 0`). `model.patch_size` and `model.encoder.moe.layers` are
checked where they are read (config validation's `model_sizes`,
`nn.vit.parse_moe_layers`): what they allow depends on other keys.
"""
import dataclasses
import math
import typing
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from vmoe_sparse_ot.config_keys import check_keys
from vmoe_sparse_ot.nn import dropless
from vmoe_sparse_ot.nn import ensemble
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import variants
from vmoe_sparse_ot.nn.dispatch import DISPATCHERS, DTYPES
from vmoe_sparse_ot.nn.routers.base import OptionError
from vmoe_sparse_ot.nn.vit import CLASSIFIERS, POSITION_EMBS
from vmoe_sparse_ot.values import is_int

MODELS = ('vit_moe', 'vit')
# model.dtype: the activations' dtype (None: float32; parameters stay float32).
MODEL_DTYPES = ('float32', 'bfloat16')

Check = Callable[[Any], Optional[str]]   # value -> None if allowed, else what it must be


def integer(minimum: int, *, optional: bool = False, allowed: Optional[str] = None) -> Check:
  """An int (not a bool) >= `minimum`, or None when `optional`.

  `allowed` words every failure; without it a value of another type 'must be an
  integer' and one below the minimum 'must be an integer >= minimum' (+ ' or None').
  """
  none = ' or None' if optional else ''

  def check(value):
    if optional and value is None:
      return None
    if not is_int(value):
      return allowed or f'must be an integer{none}'
    if value < minimum:
      return allowed or f'must be an integer >= {minimum}{none}'
    return None
  return check


def finite_number(value: Any) -> Optional[str]:
  """A finite int or float (not a bool)."""
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  return None if ok else 'must be a finite number'


def rate(*, optional: bool = False, allowed: Optional[str] = None) -> Check:
  """A finite number in [0, 1) (a dropout rate), or None when `optional`.

  Without `allowed`: 'must be a finite number in [0, 1)' for another type, 'must
  be in [0, 1)' for a number out of range.
  """
  def check(value):
    if optional and value is None:
      return None
    if finite_number(value) is not None:
      return allowed or 'must be a finite number in [0, 1)'
    if not 0 <= value < 1:
      return allowed or 'must be in [0, 1)'
    return None
  return check


def one_of(choices: Tuple, *, optional: bool = False, allowed: Optional[str] = None) -> Check:
  """One of `choices`, or None when `optional`: 'must be one of [...]' (+ ' or None')."""
  text = allowed or f"must be one of {list(choices)}{' or None' if optional else ''}"
  return lambda value: None if (optional and value is None) or value in choices else text


def flag(value: Any) -> Optional[str]:
  """A bool: 'must be True or False'."""
  return None if isinstance(value, bool) else 'must be True or False'


def variant(value: Any) -> Optional[str]:
  """None or a size `nn.variants.variant_sizes` knows."""
  return None if value is None or variants.is_variant(value) else variants.ALLOWED


def option(default: Any, doc: str, check: Optional[Check] = None) -> Any:
  """A dataclass field: a config key with its default, documentation and check."""
  return dataclasses.field(default=default, metadata={'doc': doc, 'check': check})


def section(options: Any, doc: str) -> Any:
  """A dataclass field holding a nested section: `options` is its dataclass, or
  `routers.RouterConfig` for the router's (the routers own those options)."""
  return dataclasses.field(default_factory=options, metadata={'doc': doc, 'section': options})


@dataclasses.dataclass(frozen=True)
class MoeOptions:
  """`model.encoder.moe`: the MoE layers (read for name 'vit_moe' only)."""
  layers: str = option(
      'every_2', "Where the MoE layers go, as the reference V-MoE places them: 'every_N' "
      "(blocks N-1, 2N-1, ...; 'every_2': 1, 3, 5, ...), 'last_N' (the last N of the every-2 "
      "blocks: 12 blocks, 'last_2' -> 9, 11), or a comma-separated explicit list of block "
      "indices such as '1,3' (checked against encoder.num_layers, `nn.vit.parse_moe_layers`).")
  num_experts: int = option(8, 'E: experts per MoE layer.', integer(1))
  group_size: int = option(64, 'S: tokens per routing group.', integer(1))
  dispatcher: str = option(
      'indices', "'indices' (gather/scatter into capacity buffers, default, fast), 'einsum' "
      "(one-hot einsums, the classic V-MoE) or 'dropless' (every pair a token-choice router "
      "selects, no capacity: a grouped matrix product over the tokens sorted by expert, "
      "`nn.dropless`).", one_of(tuple(sorted((*DISPATCHERS, dropless.NAME)))))
  routed_tokens_dtype: Optional[str] = option(
      None, "dtype of the data the dispatcher moves to the experts and back (the routing "
      "weights stay float32, so the combine sums in float32): None (the tokens' own), "
      "'float32' or 'bfloat16' (as the reference's Bfloat16Dispatcher).",
      one_of(DTYPES, optional=True, allowed=f'must be None or one of {list(DTYPES)}'))
  split_rngs: bool = option(
      False, "As the reference V-MoE's option: False initializes every expert alike (one "
      "draw, repeated) and shares dropout masks across experts; True draws each expert's "
      "parameters and dropout independently.", flag)
  dropout_rate: Optional[float] = option(
      None, "Dropout inside the experts' MLPs (after the GELU and after the output "
      "projection, as the reference V-MoE's MlpMoeBlock `dropout_rate`); None: "
      "encoder.dropout_rate, as the dense MLPs.",
      rate(optional=True, allowed='must be None (the experts use model.encoder.dropout_rate) '
           'or in [0, 1)'))
  mlp_dim: Optional[int] = option(
      None, "The experts' own hidden size H (the reference V-MoE's `moe.mlp_dim`, which "
      "its MoE blocks read in place of the encoder's); None: model.encoder.mlp_dim (or "
      "the variant's), as the dense MLPs.",
      integer(1, optional=True, allowed='must be None (the experts use '
              'model.encoder.mlp_dim) or an integer >= 1'))
  num_shared_experts: int = option(
      0, 'Shared experts (DeepSeekMoE): dense MLPs of the experts\' size that every token '
      'passes through, added to the routed output; each drawn apart at initialization.',
      integer(0))
  router: routers.RouterConfig = section(
      routers.RouterConfig, "The router: `name` picks it (`nn.routers.ROUTERS`); its options "
      "are defined by the routers' options dataclasses.")


@dataclasses.dataclass(frozen=True)
class EncoderOptions:
  """`model.encoder`: the transformer blocks (sizes overridden by `model.variant`)."""
  num_layers: int = option(4, 'Encoder blocks.', integer(1))
  num_heads: int = option(4, 'Attention heads (must divide model.hidden_size).', integer(1))
  mlp_dim: int = option(128, 'H: hidden size of the MLP blocks.', integer(1))
  dropout_rate: float = option(0.0, 'Dropout after the MLPs and the embedding.', rate())
  attention_dropout_rate: float = option(0.0, 'Dropout on the attention weights.', rate())
  attention_qk_norm: bool = option(
      False, "LayerNorm on each head's queries and keys before their dot product (the Soft "
      "MoE recipe's; parameters query_ln/scale and key_ln/scale).", flag)
  position_emb: str = option(
      'learned', "One of POSITION_EMBS: 'learned' (a parameter), 'sincos2d' (fixed 2-D "
      "sine-cosine, temperature 10000; none on a class token; needs model.hidden_size a "
      "multiple of 4 and >= 8) or 'none'.", one_of(POSITION_EMBS))
  moe: MoeOptions = section(MoeOptions, 'The MoE layers (name vit_moe).')


@dataclasses.dataclass(frozen=True)
class ModelOptions:
  """`model`: the model, its head and how it computes."""
  name: str = option(
      'vit_moe', "'vit_moe' (MoE layers placed by encoder.moe.layers) or 'vit' (dense ViT).",
      one_of(MODELS))
  variant: Optional[str] = option(
      None, "Optional size: ViT's 'S/32', 'B/16', 'L/14', ... (Ti, S, B, L, H; any patch) or "
      "V-MoE's 'V-MoE-S/32', 'V-MoE-B/16', ... (S, B, L, H; the V-MoE S has 8 blocks of D "
      "512). Overrides hidden_size, encoder.num_layers/num_heads/mlp_dim and patch_size; a "
      "V-MoE variant also sets representation_size to D unless it is set. None: use those "
      "keys as set.", variant)
  num_classes: Optional[int] = option(
      10, 'Classes of the head. None: no head; the model returns its representation (the '
      'pre-logits) in place of the logits (a backbone; training needs a head).',
      integer(1, optional=True, allowed='must be an integer >= 1 or None (no head: the model '
              'returns its representation)'))
  patch_size: Union[int, Tuple[int, int]] = option(
      (4, 4), 'P or (P, P): the patches the image is cut into (checked with the image size '
      'by config validation).')
  hidden_size: int = option(64, 'D: the tokens\' size.', integer(1))
  classifier: str = option('token', 'One of CLASSIFIERS.', one_of(CLASSIFIERS))
  representation_size: Optional[int] = option(
      None, 'Size of the tanh pre-logits layer; None: none (a V-MoE variant: D); 0: none, '
      'whatever the variant.', integer(0, optional=True))
  head_bias_init: float = option(0.0, "The head's bias at initialization.", finite_number)
  head_kernel_zero_init: bool = option(
      True, "True: the head kernel starts at zero; False: flax's default (LeCun normal).",
      flag)
  dtype: Optional[str] = option(
      None, "dtype of the activations and matrix products: None (float32) or 'bfloat16' "
      "(half the activation memory). Parameters stay float32; LayerNorm, the attention "
      "softmax, the router and the head compute in float32, and logits come back float32.",
      one_of(MODEL_DTYPES, optional=True))
  remat: bool = option(
      False, 'Rematerialise each encoder block in the backward pass: only block inputs are '
      'kept for it, for about one more forward pass of compute.', flag)
  ensemble_size: int = option(
      1, "E³ (Efficient Ensembles of Experts): M members, each routing among its own "
      "num_experts / M experts after the dense blocks; the members' predictions are "
      "combined by the mean of their probabilities. 1: V-MoE.",
      integer(1, allowed='must be an integer >= 1 (1: no ensemble)'))
  encoder: EncoderOptions = section(EncoderOptions, 'The transformer encoder.')


def keys(options: type) -> Tuple[str, ...]:
  """The config keys of a section: its fields, nested sections included."""
  return tuple(f.name for f in dataclasses.fields(options))


def defaults(options: type) -> Dict[str, Any]:
  """{key: default} of a section's own options (nested sections left out)."""
  return {f.name: f.default for f in dataclasses.fields(options) if 'section' not in f.metadata}


def _checked(options: type, config: Mapping[str, Any], where: str) -> Dict[str, Any]:
  """{key: value} of a section's own options: the config's value, checked and (a float
  option) made a float, or the default where the config lacks the key."""
  hints = typing.get_type_hints(options)
  out = defaults(options)
  for f in dataclasses.fields(options):
    if f.name not in out or f.name not in config:
      continue
    value, check = config[f.name], f.metadata['check']
    allowed = check(value) if check else None
    if allowed is not None:
      raise OptionError(f'{where}.{f.name}', value, allowed)
    is_float = hints[f.name] in (float, Optional[float])
    out[f.name] = float(value) if is_float and value is not None else value
  return out


def _moe_config(model_config: Mapping[str, Any]) -> Mapping[str, Any]:
  return (model_config.get('encoder') or {}).get('moe') or {}


def _checked_sections(model_config: Mapping[str, Any]):
  """(model, encoder, moe or None) values, every check passed; moe for 'vit_moe' only."""
  model = _checked(ModelOptions, model_config, 'model')
  encoder = _checked(EncoderOptions, model_config.get('encoder') or {}, 'model.encoder')
  moe = None
  if model['name'] == 'vit_moe':
    moe = _checked(MoeOptions, _moe_config(model_config), 'model.encoder.moe')
  if encoder['position_emb'] == 'sincos2d':
    hidden = model['hidden_size']
    if model['variant'] is not None:
      hidden = variants.variant_sizes(model['variant'])['hidden_size']
    if hidden % 4 or hidden < 8:
      raise OptionError('model.encoder.position_emb', encoder['position_emb'],
                        f'needs model.hidden_size a multiple of 4 and >= 8 (it is {hidden})')
  router = _moe_config(model_config).get('router') if moe else None
  if moe:
    check_dropless(moe, router or {})
  check_ensemble_size(model['ensemble_size'], model['name'], moe, router or {})
  return model, encoder, moe


def check_model_options(model_config: Mapping[str, Any]) -> None:
  """Every model option's check, and those that span options (position_emb against
  the hidden size, `check_ensemble_size`, `check_dropless`).

  `model_config` is a dict like `default_model_config()`'s (missing keys take the
  defaults); the router's options are left to the routers. Raises `OptionError`
  naming the first bad key.
  """
  _checked_sections(model_config)


def check_ensemble_size(m: int, name: str, moe: Optional[Mapping[str, Any]],
                        router: Mapping[str, Any]) -> None:
  """`model.ensemble_size` M (E³, `nn.ensemble`), an integer >= 1: M > 1 needs a
  'vit_moe' whose num_experts and group_size are multiples of M, at least K experts
  per member, and a router that `nn.ensemble.supports`.

  Args: M; the model's name; the checked `model.encoder.moe` values (None for a
  'vit'); the router's config dict (missing keys: the routers' defaults).
  """
  key = 'model.ensemble_size'
  if m == 1:
    return
  if name != 'vit_moe':
    raise OptionError(key, m, "> 1 (E³) needs model.name='vit_moe'")
  experts, group = moe['num_experts'], moe['group_size']
  if experts % m:
    raise OptionError(key, m, f'must divide model.encoder.moe.num_experts ({experts})')
  if group % m:
    raise OptionError(key, m, f'must divide model.encoder.moe.group_size ({group}): each '
                      'group holds the same number of tokens of every member')
  router_defaults = routers.default_config()
  k = router.get('num_selected_experts', router_defaults['num_selected_experts'])
  if is_int(k) and k > experts // m:
    raise OptionError(key, m, f'leaves {experts // m} experts per member, fewer than '
                      f'model.encoder.moe.router.num_selected_experts ({k})')
  router_name = router.get('name', router_defaults['name'])
  if router_name in routers.ROUTERS and not ensemble.supports(routers.ROUTERS[router_name]):
    raise OptionError(key, m, f'> 1 (E³) cannot route with router {router_name!r} (its own '
                      'logits layer or router state); use topk, sbase, sparse_ot, '
                      'expert_choice or sinkhorn_ec')


def check_dropless(moe: Mapping[str, Any], router: Mapping[str, Any]) -> None:
  """The 'dropless' dispatcher needs a token-choice router (`Router.experts_per_token`).

  Args: the checked `model.encoder.moe` values; the router's config dict (a router
  config the routers refuse is left to their own checks).
  """
  if moe['dispatcher'] != dropless.NAME:
    return
  try:
    parsed = routers.parse_router_options(router)
  except ValueError:
    return
  if routers.ROUTERS[parsed.name].experts_per_token(parsed.options, moe['num_experts']) is None:
    raise OptionError('model.encoder.moe.dispatcher', moe['dispatcher'],
                      "needs a token-choice router (topk, sbase, topk_bias, sparse_ot with "
                      f"form='token_choice'); router {parsed.name!r} here does not choose per token")


def model_options(model_config: Mapping[str, Any]) -> ModelOptions:
  """The model's options from a config dict, every one checked, before anything is traced.

  Unknown keys fail (`check_keys`); missing keys take the defaults. For 'vit_moe'
  the router's options are parsed by the routers (`routers.parse_router_options`)
  and C = `capacity(options, S, E)` is checked; for 'vit' `encoder.moe` is left at
  its defaults, unread. Raises ValueError (`OptionError` for a value) in one line
  naming the key.
  """
  check_keys(model_config, keys(ModelOptions), 'model')
  encoder_config = model_config.get('encoder') or {}
  check_keys(encoder_config, keys(EncoderOptions), 'model.encoder')
  if model_config.get('name', ModelOptions.name) == 'vit_moe':
    check_keys(_moe_config(model_config), keys(MoeOptions), 'model.encoder.moe')
  model, encoder, moe = _checked_sections(model_config)
  moe_options = MoeOptions()
  if moe is not None:
    router = routers.parse_router_options(_moe_config(model_config).get('router') or {})
    try:  # C from S, E and the router's options, checked before anything is traced.
      routers.ROUTERS[router.name].capacity(router.options, moe['group_size'],
                                            moe['num_experts'])
    except ValueError as e:
      text = str(e)
      raise ValueError(text if text.startswith('model.') else
                       f'{routers.WHERE}.{text}') from None
    moe_options = MoeOptions(**moe, router=router)
  return ModelOptions(**model, encoder=EncoderOptions(**encoder, moe=moe_options))
