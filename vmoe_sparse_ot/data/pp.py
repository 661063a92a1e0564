"""Preprocessing strings: `decode|resize(384)|value_range(-1, 1)` -> one function.

Grammar: ops separated by `|`, each `name` or `name(arg, ..., keyword=value, ...)`
with arguments written as Python literals (numbers, strings, tuples, lists,
True/False/None). The string is read with `ast` (never evaluated), so an op's
arguments can be nothing but literals. Each op maps an example dict of tensors
to an example dict; the ops apply left to right. docs/PREPROCESSING.md lists
the ops.

`build` needs no TensorFlow: it parses, finds each op in the registry, binds its
arguments and runs the op's own checks, so a bad string fails in one line
(`PPError`, a ValueError) before anything heavy runs. The returned function is
traced by tf.data.
"""
from __future__ import annotations

import ast
import inspect
from typing import Any, Callable, NamedTuple

from vmoe_sparse_ot.data import pp_general  # noqa: F401  (registers its ops)
from vmoe_sparse_ot.data import pp_image  # noqa: F401  (registers its ops)
from vmoe_sparse_ot.data import randaug  # noqa: F401  (registers its ops)
from vmoe_sparse_ot.data.pp_registry import OPS
from vmoe_sparse_ot.data.pp_registry import SEED_KEY
from vmoe_sparse_ot.data.pp_registry import VALID_KEY
from vmoe_sparse_ot.data.pp_registry import Example

__all__ = ['OPS', 'PPError', 'REFERENCE_KEYWORDS', 'SEED_KEY', 'VALID_KEY', 'OpCall', 'build',
           'is_random', 'parse']


class PPError(ValueError):
  """A pp string that does not parse or build; the message is one line."""


class OpCall(NamedTuple):
  """One `name(args, **kwargs)` of a pp string."""
  name: str
  args: tuple[Any, ...]
  kwargs: dict[str, Any]
  text: str  # As written, for messages.


def _literal(node: ast.AST, text: str) -> Any:
  try:
    return ast.literal_eval(node)
  except ValueError:
    raise PPError(f'{text!r}: arguments must be Python literals (numbers, strings, '
                  f'tuples, True/False/None), not {ast.unparse(node)!r}') from None


def _terms(node: ast.AST) -> list[ast.AST]:
  # `a|b|c` parses as ((a | b) | c): flatten the left-leaning chain of `|`.
  if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
    return _terms(node.left) + _terms(node.right)
  return [node]


def parse(pp: str) -> tuple[OpCall, ...]:
  """The op calls of `pp`, in order; raises PPError for anything else."""
  if not isinstance(pp, str):
    raise PPError(f'{pp!r}: must be a string of ops such as "decode|value_range(-1, 1)"')
  if not pp.strip():
    return ()
  source = pp.strip()
  try:
    tree = ast.parse(source, mode='eval')
  except SyntaxError as e:
    where = f' at column {e.offset}' if e.offset else ''
    raise PPError(f'not a pp string ({e.msg}{where}): ops are written '
                  'name(arg, keyword=value) and separated by "|"') from None
  calls = []
  for term in _terms(tree.body):
    text = ast.get_source_segment(source, term) or ast.unparse(term)  # As written.
    if isinstance(term, ast.Name):
      calls.append(OpCall(term.id, (), {}, text))
      continue
    if not (isinstance(term, ast.Call) and isinstance(term.func, ast.Name)):
      raise PPError(f'{text!r} is not an op: write name or name(arg, keyword=value)')
    if any(k.arg is None for k in term.keywords) or any(
        isinstance(a, ast.Starred) for a in term.args):
      raise PPError(f'{text!r}: * and ** arguments are not allowed')
    args = tuple(_literal(a, text) for a in term.args)
    kwargs = {k.arg: _literal(k.value, text) for k in term.keywords}
    calls.append(OpCall(term.func.id, args, kwargs, text))
  return tuple(calls)


# The reference code's keyword names, where ours differ: `inkey` / `outkey` of its
# single-entry ops, the `resize_size` / `resize_method` of its resizing ops.
REFERENCE_KEYWORDS = {'inkey': 'key', 'outkey': 'key_result', 'resize_size': 'size',
                      'resize_method': 'method'}


def _our_keywords(spec, call: OpCall) -> dict[str, Any]:
  """`call.kwargs` with the reference's names that the op does not take as its own
  translated to ours (REFERENCE_KEYWORDS); naming both spellings is an error."""
  params = inspect.signature(spec.builder).parameters
  kwargs = dict(call.kwargs)
  for theirs, ours in REFERENCE_KEYWORDS.items():
    if theirs in kwargs and theirs not in params and ours in params:
      if ours in kwargs:
        raise PPError(f'op {call.text!r}: {theirs}= and {ours}= name the same argument; '
                      'give one')
      kwargs[ours] = kwargs.pop(theirs)
  return kwargs


def _build_op(call: OpCall, training: bool) -> Callable[[Example], Example]:
  spec = OPS.get(call.name)
  if spec is None:
    raise PPError(f'unknown op {call.name!r}; ops: {", ".join(sorted(OPS))}')
  call = call._replace(kwargs=_our_keywords(spec, call))
  if spec.random and not training:
    raise PPError(f'op {call.text!r} is random: evaluation preprocessing must be '
                  'deterministic (random ops belong in pp_train)')
  try:
    inspect.signature(spec.builder).bind(*call.args, **call.kwargs)
  except TypeError as e:
    raise PPError(f'op {call.text!r}: {e}; accepts {spec.usage()}') from None
  try:
    return spec.builder(*call.args, **call.kwargs)
  except (TypeError, ValueError) as e:
    raise PPError(f'op {call.text!r}: {e}; accepts {spec.usage()}') from None


def build(pp: str, *, training: bool) -> Callable[[Example], Example]:
  """The function applying the ops of `pp` in order (identity for an empty string).

  `training=False` refuses random ops. Random ops read the per-example seed
  `example[SEED_KEY]` (int64 (2,)), which the caller sets and removes.
  """
  ops = [_build_op(call, training) for call in parse(pp)]

  def preprocess(example: Example) -> Example:
    for op in ops:
      example = op(example)
    return example

  return preprocess


def is_random(pp: str) -> bool:
  """Whether any op of `pp` draws random numbers (then it needs per-example seeds)."""
  return any(OPS[c.name].random for c in parse(pp) if c.name in OPS)
