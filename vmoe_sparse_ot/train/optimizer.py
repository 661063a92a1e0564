"""optax optimizer and learning-rate schedule from `config.optimizer` / `config.schedule`."""
from __future__ import annotations

import re
from typing import Any, Mapping

import jax
import optax

from vmoe_sparse_ot import trees
from vmoe_sparse_ot.config.schema import SCHEDULE_EXTRA_KEYS
from vmoe_sparse_ot.initialization import names


def resolved_schedule(schedule: Mapping[str, Any], train_steps: int) -> dict[str, Any]:
  """`schedule` with its `decay_steps` filled in: when unset, until `train_steps`.

  The schedule depends on `train_steps` through this alone.
  """
  resolved = dict(schedule)
  if resolved.get('decay_steps') is None:
    resolved['decay_steps'] = max(int(train_steps) - int(schedule['warmup_steps']), 1)
  return resolved


def make_schedule(schedule: Mapping[str, Any], train_steps: int) -> optax.Schedule:
  """The learning rate at each step t of `config.schedule`.

  Every name but 'constant' warms up linearly from 0 to `peak_value` over
  `warmup_steps`; then, for `decay_steps` steps (default: until `train_steps`):
  - 'warmup_constant': `peak_value`; 'constant': `peak_value` from step 0;
  - 'warmup_linear_decay', 'warmup_cosine_decay': to `end_value`;
  - 'warmup_polynomial_decay': end + (peak - end) (1 - s / decay_steps) ** power;
  - 'warmup_exponential_decay': peak decay_rate ** ((s - transition_begin) /
    transition_steps) (whole transitions with `staircase`), not below `end_value`
    when that is > 0, and without end;
  - 'big_vision_rsqrt': peak / sqrt(1 + s / timescale), then linear to 0 over the
    last `cooldown_steps` of the decay;
  where s = t - warmup_steps. Each is the reference V-MoE code's schedule of the
  same name, with its decay_steps counted from the end of warmup.
  """
  schedule = resolved_schedule(schedule, train_steps)
  name = schedule['name']
  peak, end = float(schedule['peak_value']), float(schedule['end_value'])
  warmup = int(schedule['warmup_steps'])
  decay_steps = int(schedule['decay_steps'])
  if name == 'constant':
    return optax.constant_schedule(peak)
  if name == 'warmup_constant':
    after = optax.constant_schedule(peak)
  elif name == 'warmup_linear_decay':
    after = optax.linear_schedule(peak, end, decay_steps)
  elif name == 'warmup_cosine_decay':
    after = optax.cosine_decay_schedule(peak, decay_steps, alpha=end / peak if peak else 0.0)
  elif name == 'warmup_polynomial_decay':
    after = optax.polynomial_schedule(peak, end, float(schedule['power']), decay_steps)
  elif name == 'warmup_exponential_decay':
    after = optax.exponential_decay(
        peak, int(schedule['transition_steps']), float(schedule['decay_rate']),
        transition_begin=int(schedule['transition_begin']),
        staircase=bool(schedule['staircase']), end_value=end or None)
  elif name == 'big_vision_rsqrt':
    after = _rsqrt_with_cooldown(peak, decay_steps, float(schedule['timescale']),
                                 int(schedule['cooldown_steps']))
  else:
    raise ValueError(f'schedule.name must be one of {sorted(SCHEDULE_EXTRA_KEYS)}; '
                     f'got {name!r}')
  if warmup <= 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def _rsqrt_with_cooldown(peak: float, decay_steps: int, timescale: float,
                         cooldown_steps: int) -> optax.Schedule:
  """peak / sqrt(1 + s / timescale) for s < decay_steps - cooldown_steps, then linear
  from there to 0 at s = decay_steps (s counts from the end of warmup)."""
  if cooldown_steps > decay_steps:
    raise ValueError(f'schedule.cooldown_steps={cooldown_steps} must be <= decay_steps '
                     f'({decay_steps})')
  main = decay_steps - cooldown_steps
  before_cooldown = peak / (1.0 + main / timescale) ** 0.5

  def rsqrt(count):
    return peak * jax.lax.rsqrt(1.0 + count / timescale)

  def cooldown(count):
    return jax.numpy.where(count < cooldown_steps,
                           before_cooldown * (1.0 - count / cooldown_steps), 0.0)

  if cooldown_steps <= 0:
    return rsqrt
  return optax.join_schedules([rsqrt, cooldown], [main])


def param_name(path, naming: str = 'ours') -> str:
  """The '/'-joined name of the parameter at jax key `path`, written in `naming`:
  'ours' ('encoder/encoderblock_1/moe/experts/wi_kernel') or 'vmoe', the reference
  V-MoE's ('Encoder/encoderblock_1/Moe/Mlp/Dense_0/kernel'), which the regexes of
  its config files are written against (`optimizer.param_naming`)."""
  return names.from_ours(trees.path_name(path), naming)


def path_mask(params: Any, regex: str, naming: str = 'ours') -> Any:
  """Bool tree: True where the parameter's name in `naming` matches `regex` (re.search)."""
  pattern = re.compile(regex)
  return jax.tree_util.tree_map_with_path(
      lambda path, _: bool(pattern.search(param_name(path, naming))), params)


def make_optimizer(optimizer: Mapping[str, Any], schedule: optax.Schedule,
                   params: Any) -> optax.GradientTransformation:
  """Gradient clipping (optional), then Adam/AdamW, SGD or Adafactor, with decoupled
  weight decay.

  Parameters matching `freeze` (a regex, or None) are not updated (their
  gradients still count in the clipping norm, as in the reference). The regexes of
  `freeze`, `weight_decay` and `weight_decay_regex` are matched (re.search)
  against each parameter's name written in `param_naming` (`param_name`).

  Weight decay is decoupled from the adaptive moments and scaled by the learning
  rate (AdamW; V-MoE's "Adam, weight decay 0.1"), applied to the parameters
  matching `weight_decay_regex` (kernels by default); a list of (regex, value)
  gives each parameter the value of the first regex its path matches (none: 0),
  as the reference code does. `mu_dtype` (None: the
  parameters' dtype) stores Adam's first moment, SGD's and Adafactor's momentum
  in that dtype, e.g. 'bfloat16' to halve their memory.
  """
  name = optimizer['name']
  wd = optimizer['weight_decay']
  naming = optimizer.get('param_naming', 'ours')
  mu_dtype = optimizer.get('mu_dtype')
  if name in ('adam', 'adamw'):
    core = [optax.scale_by_adam(b1=float(optimizer['b1']), b2=float(optimizer['b2']),
                                eps=float(optimizer['eps']), mu_dtype=mu_dtype)]
  elif name == 'sgd':
    core = [optax.trace(decay=float(optimizer['momentum']), accumulator_dtype=mu_dtype)]
  elif name == 'adafactor':
    core = adafactor(momentum=float(optimizer['momentum']), b2_cap=float(optimizer['b2']),
                     mu_dtype=mu_dtype)
  else:
    raise ValueError(f"optimizer.name must be one of 'adam', 'adamw', 'sgd', 'adafactor'; "
                     f"got {name!r}")
  chain = []
  clip = optimizer.get('gradient_clip_norm')
  if clip is not None:
    chain.append(optax.clip_by_global_norm(float(clip)))
  chain += core
  if isinstance(wd, (list, tuple)):
    chain.append(add_decayed_weights_by_path(weight_decay_factors(params, wd, naming)))
  elif wd:
    chain.append(optax.add_decayed_weights(
        float(wd), mask=path_mask(params, optimizer['weight_decay_regex'], naming)))
  chain.append(optax.scale_by_learning_rate(schedule))
  freeze = optimizer.get('freeze')
  if freeze is None:
    return optax.chain(*chain)
  # Frozen parameters: their updates are zeroed at the end of the chain, as the
  # reference's freeze_weights does, so their gradients count in the clipping
  # norm as there (a fine-tuning recipe clips the same). The optimizer state
  # keeps its usual structure, so its sharding and checkpoints are those of a run
  # without freezing.
  return optax.chain(*chain, _zero_where(path_mask(params, freeze, naming)))


def weight_decay_factors(params: Any, pairs, naming: str = 'ours') -> Any:
  """Float tree: each parameter's factor, the value of the first regex of `pairs`
  ((regex, value), ...) its name in `naming` matches; 0 when none does."""
  compiled = [(re.compile(regex), float(value)) for regex, value in pairs]

  def factor(path, _):
    name = param_name(path, naming)
    return next((value for pattern, value in compiled if pattern.search(name)), 0.0)

  return jax.tree_util.tree_map_with_path(factor, params)


def add_decayed_weights_by_path(factors: Any) -> optax.GradientTransformation:
  """Stateless: updates + factor * params, with a (static) factor per parameter."""
  def update(updates, params=None):
    if params is None:
      raise ValueError('weight decay needs the parameters: call update(updates, state, params)')
    return jax.tree.map(lambda u, p, f: u + f * p if f else u, updates, params, factors)
  return optax.stateless(update)


def adafactor(momentum: float = 0.9, b2_cap: float = 0.999, decay_exponent: float = 0.8,
              min_dim_size_to_factor: int = 32, eps: float = 1e-30,
              mu_dtype: Any = None) -> list[optax.GradientTransformation]:
  """Adafactor as large ViTs are trained with it: factored second moments, momentum.

  The second moment of a matrix (the two largest dimensions of at least
  `min_dim_size_to_factor`) is kept as its row and column means, so its memory
  is O(rows + cols) instead of O(rows x cols). Its decay at step t is
  1 - (t + 1)^-0.8, capped at `b2_cap`. The scaled update is then averaged with
  momentum (an exponential moving average kept in `mu_dtype`); momentum 0 skips it.
  """
  def decay_rate(step, exponent):
    return jax.numpy.minimum(1.0 - (step + 1.0) ** -exponent, b2_cap)

  chain = [optax.scale_by_factored_rms(
      decay_rate=decay_exponent, min_dim_size_to_factor=min_dim_size_to_factor,
      epsilon=eps, decay_rate_fn=decay_rate)]
  if momentum:
    chain.append(optax.ema(momentum, debias=False, accumulator_dtype=mu_dtype))
  return chain


def _zero_where(mask: Any) -> optax.GradientTransformation:
  """Stateless: replaces the updates where the bool tree `mask` is True by zeros."""
  def update(updates, params=None):
    del params
    return jax.tree.map(lambda u, m: jax.numpy.zeros_like(u) if m else u, updates, mask)
  return optax.stateless(update)


def frozen_names(params: Any, regex: str | None, naming: str = 'ours') -> list[str]:
  """'/'-joined paths (this project's names) of the parameters `optimizer.freeze`
  keeps fixed, `regex` matched against their names in `naming`."""
  if regex is None:
    return []
  pattern = re.compile(regex)
  return [trees.path_name(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]
          if pattern.search(param_name(p, naming))]
