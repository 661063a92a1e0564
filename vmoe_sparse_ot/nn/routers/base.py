"""What every router module provides, and the generic parsing of router options.

A router is a `Router`: a name, a frozen options dataclass (each field's
default written once, in the dataclass), and a route function

  route(logits, token_mask, opts, capacity, train, rng) -> Routing | SoftRouting

with logits (G, S, E) from the MoE layer's 'router' Dense layer (or whatever
the router's `logits_module` returns), token_mask (G, S) bool (False for
padding: it gets no weight, and the real tokens route as they would alone at
the same C, whatever the padding's logits), C = `capacity(opts, S, E)` buffer
slots per expert, and an rng only when `needs_rng(opts, train)`. The MoE layer
asks the `Router` for these and never looks at its name.

A router with state that changes between training steps outside the gradient
(e.g. `topk_bias`'s per-expert bias) also gives a `RouterState`: `init(opts, E)`
is the layer's state at step 0, {name: array}; its route function then takes
the state as a keyword and returns the step's statistics with the routing,

  route(logits, token_mask, opts, capacity, train, rng, state=state)
      -> (Routing | SoftRouting, statistics {name: array})

and after each optimizer step the trainer calls `update(opts, state,
statistics)`, the statistics summed over the step's microbatches. The MoE layer
keeps the state in the Flax collection 'router_state' and writes the
statistics to 'router_stats' (see `nn.router_state`): the plug-in itself never
touches Flax variables, the train state or checkpoints.

Options live in the config under `model.encoder.moe.router`:
- fields of `CommonOptions`, and fields marked `top_level=True`, are read from
  the router dict itself (`router.num_selected_experts`, `router.noise_std`);
- every other field from the router's own section (`router.sparse_ot.num_steps`).
`parse_options` converts and checks each field from its annotation and
metadata (`choices`, `check`), so errors name the full config key; the one
implementation of those checks, which config validation calls too
(`check_option`), raising `OptionError`.
"""
import dataclasses
import math
import numbers
import typing
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.config_keys import check_keys  # noqa: F401  (re-exported: nn.routers.check_keys)
from vmoe_sparse_ot.nn import routing as rt

Array = jax.Array
AnyRouting = Union[rt.Routing, rt.SoftRouting]


class OptionError(ValueError):
  """A model or router option's value is not allowed: `{key} {allowed}, got {value!r}`.

  `key` is the full config key without the 'config.' prefix (e.g.
  'model.encoder.moe.router.capacity'), `allowed` what the value must be ('must
  be > 0'); config validation words the same three parts its own way.
  """

  def __init__(self, key: str, value: Any, allowed: str):
    super().__init__(f"{key} {allowed}, got {value!r}")
    self.key, self.value, self.allowed = key, value, allowed


# Checks for `option(check=...)`: (predicate, what the value must be).
POSITIVE = (lambda v: v > 0, "> 0")
NON_NEGATIVE = (lambda v: v >= 0, ">= 0")
AT_LEAST_ONE = (lambda v: v >= 1, ">= 1")


def option(default: Any, doc: str, *, choices: Optional[Tuple] = None,
           check: Optional[Tuple[Callable[[Any], bool], str]] = None,
           top_level: bool = False) -> Any:
  """A dataclass field with its config documentation and validation."""
  return dataclasses.field(default=default, metadata={
      "doc": doc, "choices": choices, "check": check, "top_level": top_level})


@dataclasses.dataclass(frozen=True)
class CommonOptions:
  """Options every router reads from the top level of the router config."""
  num_selected_experts: int = option(
      2, "K: experts per token (also sets C below).", check=AT_LEAST_ONE)
  capacity_factor: float = option(
      1.0, "C = ceil(S * K * capacity_factor / E), rounded up to a multiple of 4 "
      "(the reference V-MoE's rule for token choice; `capacity_ceil_or_round` and "
      "`capacity_multiple_of` change both steps); routers that count tokens per "
      "expert (expert_choice) use S instead of S * K. Unused when `capacity` is set.",
      check=POSITIVE)
  capacity_ceil_or_round: str = option(
      "ceil", "How C is made whole from S * K * capacity_factor / E: 'ceil' (default) "
      "or 'round' (Python's round: halves to even), as the reference V-MoE's "
      "dispatcher option of this name.", choices=rt.CEIL_OR_ROUND)
  capacity_multiple_of: int = option(
      4, "C is then raised to the next multiple of this (0 or 1: left as is), as the "
      "reference V-MoE's dispatcher option of this name.", check=NON_NEGATIVE)
  capacity: Optional[int] = option(
      None, "C, used as is when set (capped at S).", check=AT_LEAST_ONE)
  batch_priority: bool = option(
      False, "Batch-prioritized routing (token-choice routers): tokens with larger "
      "top scores claim buffer slots first.")
  z_loss_weight: float = option(
      0.0, "Weight of the router z-loss (ST-MoE), the mean over real tokens of "
      "logsumexp(logits)^2, added to the layer's auxiliary loss (`nn.router_health`); "
      "0: off (the metric `z_loss` is reported either way).", check=NON_NEGATIVE)


def default_capacity(opts: CommonOptions, group_size: int, num_experts: int) -> int:
  """C for the router's expert buffers (V-MoE's rule, see `routing.compute_capacity`)."""
  return rt.compute_capacity(group_size, num_experts, opts.num_selected_experts,
                             opts.capacity_factor, opts.capacity,
                             ceil_or_round=opts.capacity_ceil_or_round,
                             multiple_of=opts.capacity_multiple_of)


def gate_noise_std(noise_std: Optional[float], num_experts: int) -> float:
  """Std of the Gaussian noise a noisy router adds to its logits: noise_std / E.

  The reference V-MoE routers scale their `noise_std` option by 1/E, so a config
  ported from it (noise_std=1.0, the default) adds noise of std 1/E. None counts
  as 1.0.
  """
  return (1.0 if noise_std is None else float(noise_std)) / num_experts


def dense_logits(opts, num_experts: int, capacity: int, name: str) -> nn.Module:
  """The default router layer: tokens (G, S, D) -> logits (G, S, E), no bias."""
  del opts, capacity
  return nn.Dense(num_experts, use_bias=False,
                  kernel_init=nn.initializers.normal(stddev=0.02), name=name)


def never(opts, train: bool) -> bool:
  del opts, train
  return False


def no_token_choice(opts, num_experts: int) -> None:
  del opts, num_experts


def top_k_per_token(opts, num_experts: int) -> int:
  """K = min(num_selected_experts, E): the experts a token-choice router gives a token."""
  return min(opts.num_selected_experts, num_experts)


State = Dict[str, Array]


@dataclasses.dataclass(frozen=True)
class RouterState:
  """A stateful router's state, per MoE layer (see the module docstring).

  init: (opts, E) -> the state at step 0, {name: array}.
  update: (opts, state, statistics) -> the state after one optimizer step, from
    the statistics the route function returned, summed over the step's
    microbatches. It runs outside the gradient; it must be a pure function of
    its inputs (the trainer's exact resume relies on it).
  """
  init: Callable[[Any, int], State]
  update: Callable[[Any, State, State], State]


@dataclasses.dataclass(frozen=True)
class Router:
  """A router plug-in; see the module docstring for the contract."""
  name: str
  options: type
  route: Callable[..., AnyRouting]
  needs_rng: Callable[[Any, bool], bool] = never
  capacity: Callable[[Any, int, int], int] = default_capacity
  logits_module: Callable[..., nn.Module] = dense_logits
  state: Optional[RouterState] = None   # None: stateless (route returns the routing alone)
  # Token-choice routers: (opts, E) -> K, the most experts a token gets (the
  # 'dropless' dispatcher serves them all); None for the others.
  experts_per_token: Callable[[Any, int], Optional[int]] = no_token_choice
  # Options (fields of `options`) no other router reads: set to another value than
  # their default while `name` picks another router, they are refused (one line).
  exclusive: Tuple[str, ...] = ()


def top_level_fields(options: type) -> Tuple[str, ...]:
  common = {f.name for f in dataclasses.fields(CommonOptions)}
  return tuple(f.name for f in dataclasses.fields(options)
               if f.name in common or f.metadata.get("top_level"))


def section_fields(options: type) -> Tuple[str, ...]:
  top = set(top_level_fields(options))
  return tuple(f.name for f in dataclasses.fields(options) if f.name not in top)


_KINDS = {bool: "True or False", int: "an integer", float: "a finite number", str: "a string"}


def _unwrap(annotation: Any) -> Tuple[Any, bool]:
  """(the type, whether None is allowed) of a field's annotation."""
  args = typing.get_args(annotation)
  if typing.get_origin(annotation) is Union and type(None) in args:
    return next(a for a in args if a is not type(None)), True
  return annotation, False


def check_option(options: type, name: str, value: Any, key: str) -> Any:
  """`value` of the field `name` of `options`, converted to its type and checked.

  Raises `OptionError` naming `key` when the value has the wrong type (a float
  must be finite), lies outside the field's `choices` or fails its `check`. The
  allowed values are worded from the type: 'must be an integer >= 1', 'must be
  > 0 or None' (a float in range), 'must be a finite number > 0' (not a float).
  """
  f = next(f for f in dataclasses.fields(options) if f.name == name)
  kind, optional = _unwrap(typing.get_type_hints(options)[name])
  choices, check = f.metadata.get("choices"), f.metadata.get("check")
  none = " or None" if optional else ""
  if value is None and optional:
    return None
  is_real = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if kind is bool and isinstance(value, (bool, numbers.Integral)):
    converted = bool(value)
  elif kind is int and is_real and math.isfinite(value) and float(value).is_integer():
    converted = int(value)
  elif kind is float and is_real and math.isfinite(value):
    converted = float(value)
  elif kind is str and isinstance(value, str):
    converted = value
  else:
    what = _KINDS.get(kind, getattr(kind, "__name__", str(kind)))
    raise OptionError(key, value, f"must be {what}{' ' + check[1] if check else ''}{none}")
  if choices is not None and converted not in choices:
    raise OptionError(key, value, f"must be one of {list(choices)}{none}")
  if check is not None and not check[0](converted):
    what = "an integer " if kind is int else ""
    raise OptionError(key, value, f"must be {what}{check[1]}{none}")
  return converted


def parse_options(options: type, top: Mapping[str, Any], section: Mapping[str, Any],
                  where: str, section_where: str):
  """Builds `options` from config dicts: top-level keys from `top`, the rest from `section`.

  Missing keys take the dataclass defaults. Raises `OptionError` (a ValueError)
  naming the full key for a wrong type, a value outside `choices`, or a failed
  `check` (see `check_option`).
  """
  top_names = set(top_level_fields(options))
  kwargs = {}
  for f in dataclasses.fields(options):
    src, prefix = (top, where) if f.name in top_names else (section, section_where)
    if f.name in src:
      kwargs[f.name] = check_option(options, f.name, src[f.name], f"{prefix}.{f.name}")
  return options(**kwargs)


def finish(gates: Array, token_index: Array, valid: Array, auxiliary_loss: Array,
           extra: Optional[Dict[str, Array]] = None) -> rt.Routing:
  """A `Routing` whose combine weights are `gates` (G, S, E) at the assigned slots."""
  token_index = jax.lax.stop_gradient(token_index)
  weight = rt.gather_gates(gates, token_index, valid)
  # The MoE layer adds the metrics common to all routers (`nn.routing_metrics`).
  metrics = {"auxiliary_loss": jax.lax.stop_gradient(auxiliary_loss), **(extra or {})}
  return rt.Routing(token_index, valid, weight, auxiliary_loss, metrics)


def assign_top_k(scores: Array, token_mask: Array, num_experts: int, k: int, capacity: int,
                 batch_priority: bool, choice_mask_positive: bool = False):
  """Token choice on (G, S, E) scores: each token's top-k experts, slots in priority order.

  Returns (token_index, valid), see `routing.assign_token_choice`.
  """
  top, expert_index = jax.lax.top_k(jax.lax.stop_gradient(scores), k)
  priority = top[..., 0] if batch_priority else None
  choice_mask = top > 0 if choice_mask_positive else None
  return rt.assign_token_choice(expert_index, token_mask, num_experts, capacity, priority,
                                choice_mask)


def zero_loss() -> Array:
  return jnp.zeros((), jnp.float32)

