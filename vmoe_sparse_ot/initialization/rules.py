"""Mapping a source's parameters onto a model's: user rules first, then the defaults.

Pure functions over flat `{name: array}` dicts (names in this project's naming,
see `names`). A rule is `(regex, replacement[, transform])`: the first rule whose
regex matches a source name in full renames it to `match.expand(replacement)`
(an empty replacement drops the entry) and applies the named transform
(`transforms.TRANSFORMS`). Source names no rule matches go through the defaults:

- the same name in the target, same shape: copied;
- `encoder/pos_embedding` of another shape: the patch grid resized (`zoom_posemb`);
- `head/*` of another shape (another label set), or absent from the source: the
  target's own head is kept (zero kernel: ViT fine-tuning's head);
- a dense block's `mlp/Dense_{0,1}` where the target has an MoE layer: copied into
  every expert (`upcycle`), the shared experts too; the new layer's router keeps its
  fresh init;
- a router kernel (D, M, E/M) where the target has (D, E): reshaped (the
  reference's E³ router, one kernel per member; `nn.ensemble`).

An expert parameter, or a dense MLP parameter upcycled into one, whose hidden
size is not the experts' (`model.encoder.moe.mlp_dim`) is refused, naming that key.

Everything else is reported: target parameters left at their fresh init, source
entries not used. Shape mismatches name both keys and shapes.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

from vmoe_sparse_ot.initialization import transforms as transforms_lib

_DENSE_TO_EXPERTS = {'mlp/Dense_0/kernel': 'moe/experts/wi_kernel',
                     'mlp/Dense_0/bias': 'moe/experts/wi_bias',
                     'mlp/Dense_1/kernel': 'moe/experts/wo_kernel',
                     'mlp/Dense_1/bias': 'moe/experts/wo_bias'}
_DENSE_RE = re.compile(r'^(encoder/encoderblock_\d+)/(mlp/Dense_[01]/(?:kernel|bias))$')
POSEMB = 'encoder/pos_embedding'
# The hidden-size axis H of each expert parameter (wo_bias has none) and of the dense
# MLP parameter that upcycles into it.
_WIDTH_AXIS = {'wi_kernel': -1, 'wi_bias': -1, 'wo_kernel': -2}


def _upcycled_names(dense: re.Match, target: Mapping[str, Any]) -> list:
  """The target's expert parameters a dense block's MLP parameter fills: the routed
  experts' and the shared experts' (`moe/shared_experts/...`) where the model has them."""
  block, experts = dense.group(1), _DENSE_TO_EXPERTS[dense.group(2)]
  names = (f'{block}/{experts}', f'{block}/{experts.replace("/experts/", "/shared_experts/")}')
  return [name for name in names if name in target]


class InitializationError(ValueError):
  """A source that does not fit the model, or a bad rule; the message is one line."""


@dataclasses.dataclass(frozen=True)
class Rule:
  pattern: re.Pattern
  replacement: str
  transform: str | None
  where: str   # 'initialization.rules[i]', for messages.


@dataclasses.dataclass
class Mapped:
  """The outcome of `map_onto`.

  params: {target name: array} for every target parameter taken from the source.
  log: one line per default that fired ("upcycled ...", "position embedding
    resized ...", "head re-initialized ...").
  uninitialized: target names left at their fresh init (not counting the head
    and upcycled routers, which the log reports).
  unused: source names that initialize nothing.
  sources: {target name: source name} of `params`.
  layouts: the lines of `log` that only lay the same values out in the target's
    shape (the reference's E³ router kernel): no adaptation, so a job that takes
    a checkpoint as it is (`evaluate.released`) accepts them.
  """
  params: dict[str, np.ndarray]
  log: list[str]
  uninitialized: list[str]
  unused: list[str]
  sources: dict[str, str]
  layouts: list[str] = dataclasses.field(default_factory=list)


def parse_rules(rules: Sequence[Any] | None) -> list[Rule]:
  """Rules from the config: each a (regex, replacement) or (regex, replacement, transform)."""
  out = []
  for i, rule in enumerate(rules or ()):
    where = f'initialization.rules[{i}]'
    if isinstance(rule, str) or not isinstance(rule, Sequence) or len(rule) not in (2, 3):
      raise InitializationError(f'{where} must be (regex, replacement[, transform]), '
                                f'got {rule!r}')
    regex, replacement = rule[0], rule[1]
    transform = rule[2] if len(rule) == 3 else None
    if not isinstance(regex, str) or not isinstance(replacement, str):
      raise InitializationError(f'{where}: regex and replacement must be strings, got {rule!r}')
    try:
      pattern = re.compile(regex)
    except re.error as e:
      raise InitializationError(f'{where}: bad regex {regex!r} ({e})') from None
    if transform is not None and transform not in transforms_lib.TRANSFORMS:
      raise InitializationError(f'{where}: unknown transform {transform!r}; one of '
                                f'{sorted(transforms_lib.TRANSFORMS)}')
    out.append(Rule(pattern, replacement, transform, where))
  return out


def _grid_text(tokens: int, prefix: int) -> str:
  side = int(round((tokens - prefix) ** 0.5))
  return f'{side}x{side}'


def map_onto(source: Mapping[str, np.ndarray], target: Mapping[str, Sequence[int]],
             rules: Sequence[Rule] = (), *, num_prefix_tokens: int = 0) -> Mapped:
  """Maps `source` arrays onto the `target` {name: shape}; see the module docstring.

  Raises InitializationError for a rule that matches nothing, a rule whose result
  the target lacks, a transform that fails, or a shape mismatch.
  """
  context = {'num_prefix_tokens': num_prefix_tokens}
  params, origin, log, unused, layouts = {}, {}, [], [], []
  used_rules = [0] * len(rules)
  upcycled, head_kept = set(), None

  def width(name, shape):
    # No default changes a width: a source of other hidden size is refused, naming the key.
    axis = _WIDTH_AXIS.get(name.rsplit('/', 1)[-1]) if '/moe/experts/' in name else None
    if axis is None or len(shape) < -axis or shape[axis] == target[name][axis]:
      return ''
    return (f"; the experts' hidden size is {target[name][axis]}, the source's {shape[axis]}: "
            'set model.encoder.moe.mlp_dim (None: model.encoder.mlp_dim)')

  def put(name, array, src, how):
    shape = tuple(target[name])
    if tuple(array.shape) != shape:
      raise InitializationError(f'shape mismatch: source {src} {tuple(array.shape)} -> '
                                f'target {name} {shape}{how}{width(name, array.shape)}')
    if name in params:
      raise InitializationError(f'target {name} is initialized twice, from {origin[name]} '
                                f'and {src}')
    params[name], origin[name] = array, src

  def transform(name, kind, array, src, where):
    try:
      return transforms_lib.TRANSFORMS[kind](array, target[name], context)
    except ValueError as e:
      raise InitializationError(f'{where}: {src} -> {name}: {e}'
                                f'{width(name, array.shape)}') from None

  for src in sorted(source):
    array = np.asarray(source[src])
    rule_index = next((i for i, r in enumerate(rules) if r.pattern.fullmatch(src)), None)
    if rule_index is not None:
      rule = rules[rule_index]
      used_rules[rule_index] += 1
      if not rule.replacement:  # Dropped on purpose: not reported as unused.
        continue
      name = rule.pattern.fullmatch(src).expand(rule.replacement)
      if name not in target:
        raise InitializationError(f'{rule.where} maps {src} to {name}, which the model '
                                  'does not have')
      if rule.transform:
        array = transform(name, rule.transform, array, src, rule.where)
      put(name, array, src, f' (by {rule.where})')
      continue
    dense = _DENSE_RE.match(src)
    if src in target:
      if tuple(array.shape) == tuple(target[src]):
        put(src, array, src, '')
      elif src == POSEMB:
        put(src, transform(src, 'zoom_posemb', array, src, 'default'), src, '')
        log.append(f'position embedding resized from a '
                   f'{_grid_text(array.shape[1], num_prefix_tokens)} to a '
                   f'{_grid_text(target[src][1], num_prefix_tokens)} patch grid')
      elif src.startswith('head/'):
        head_kept = (array.shape, tuple(target[src]))
      elif (src.endswith('/moe/router/kernel') and array.ndim == 3 and len(target[src]) == 2
            and array.shape[0] == target[src][0] and array.size == math.prod(target[src])):
        # The reference's E³ router keeps one (D, E/M) kernel per member as (D, M, E/M);
        # member m's experts are m*E/M .. here too, so it is that kernel reshaped.
        put(src, array.reshape(tuple(target[src])), src, '')
        layouts.append(f'{src}: an E³ router kernel {tuple(array.shape)} (D, M, E/M) '
                       f'reshaped to {tuple(target[src])}')
        log.append(layouts[-1])
      else:
        put(src, array, src, '')  # Raises, naming both shapes.
    elif dense and _upcycled_names(dense, target):
      for name in _upcycled_names(dense, target):
        put(name, transform(name, 'upcycle', array, src, 'default'), src, ' (upcycled)')
      upcycled.add(dense.group(1))
    else:
      unused.append(src)

  for rule, count in zip(rules, used_rules):
    if not count:
      raise InitializationError(f'{rule.where} ({rule.pattern.pattern!r}) matches no source '
                                'parameter')
  if upcycled:
    first = sorted(upcycled)[0]
    experts = target[f'{first}/moe/experts/wi_kernel'][0]
    shared = target.get(f'{first}/moe/shared_experts/wi_kernel', (0,))[0]
    shared = f' and {shared} shared expert(s)' if shared else ''
    log.append(f'upcycled {len(upcycled)} MoE layer(s) ({", ".join(sorted(upcycled))}) from '
               f'the dense MLPs into {experts} experts{shared} each; their routers start fresh')
  new_routers = {n for n in target if any(n.startswith(f'{b}/moe/router/') for b in upcycled)}
  heads = {n for n in target if n.startswith('head/')}
  if heads and not heads <= set(params):
    if head_kept:
      log.append(f'head re-initialized (source {head_kept[0]} -> target {head_kept[1]}): '
                 'zero kernel, as in ViT fine-tuning')
    else:
      log.append('head re-initialized (the source has none)')
  uninitialized = sorted(n for n in target
                         if n not in params and n not in new_routers and n not in heads)
  return Mapped(params=params, log=log, uninitialized=uninitialized, unused=sorted(unused),
                sources=dict(origin), layouts=layouts)
