"""When a run may resume from a checkpoint: the model, the input stream, the optimizer
and the schedule it records against this run's (one line naming every difference).
"""
from __future__ import annotations

from typing import Any

from vmoe_sparse_ot.errors import ResumeMismatchError
from vmoe_sparse_ot.nn.model_config import without_compute_keys
from vmoe_sparse_ot.trees import differences, flatten, leaf_shapes, shape_differences


def param_shapes(params: Any) -> dict[str, list[int]]:
  """{'a/b/kernel': shape} for a params tree of arrays or ShapeDtypeStructs."""
  return leaf_shapes(params)


def _differences(saved: Any, now: Any, prefix: str) -> list[str]:
  """'prefix.a.b: checkpoint X, config Y' per differing key (`prefix` alone for a value)."""
  named = lambda tree: flatten(tree, prefix + '.') if isinstance(tree, dict) else {prefix: tree}
  return differences(named(saved), named(now), labels=('checkpoint', 'config'), show=repr)


def _join(problems: list[str], limit: int = 12) -> str:
  more = f'; ... and {len(problems) - limit} more' if len(problems) > limit else ''
  return '; '.join(problems[:limit]) + more


def check_compatible(meta: dict[str, Any], model_config: dict[str, Any],
                     abstract_params: Any, directory: str) -> None:
  """Raises ResumeMismatchError naming what differs between a checkpoint and the model."""
  # model.dtype / model.remat change how the model computes, not its parameters.
  problems = _differences(without_compute_keys(meta.get('model_config') or {}),
                          without_compute_keys(model_config), 'model')
  problems += ['param ' + line for line in shape_differences(
      meta.get('param_shapes', {}), param_shapes(abstract_params),
      labels=('checkpoint shape', 'config shape'))]
  if problems:
    raise ResumeMismatchError(
        f'The checkpoint in {directory} does not match the config; use a fresh --workdir '
        f'or the config it was trained with. Differences: {_join(problems)}')


_SAMPLING_HINT = ("(A checkpoint without dataset.sampling read its data with "
                  "config.dataset.sampling='stream': set it to resume.) ")


def check_resume(meta: dict[str, Any], expected: dict[str, Any], directory: str, *,
                 allow_schedule_change: bool = False) -> list[str]:
  """Compares the input stream, optimizer and schedule of a checkpoint with this run.

  `expected` holds this run's 'data', 'optimizer', 'schedule' and 'train_steps'.
  A different input stream or optimizer always fails (the optimizer state would
  not fit or would mean something else); a different schedule or train_steps
  fails unless `allow_schedule_change`, and is then returned, to be logged.
  A key the checkpoint does not record is not compared.
  """
  step = meta.get('step', '?')
  if 'data' in meta and meta['data'] != expected['data']:
    raise ResumeMismatchError(
        f'The checkpoint in {directory} was trained on a different input stream: '
        f'{_join(_differences(meta["data"], expected["data"], "dataset"))}. '
        f'{_SAMPLING_HINT if "sampling" not in meta["data"] else ""}Use a fresh --workdir.')
  if 'optimizer' in meta:
    changed = _differences(meta['optimizer'], expected['optimizer'], 'optimizer')
    if changed:
      raise ResumeMismatchError(
          f'Cannot resume from step {step} in {directory}: the optimizer differs from the '
          f'checkpoint\'s: {_join(changed)}. Use the checkpoint\'s optimizer settings or a '
          'fresh --workdir.')
  changed = []
  if 'schedule' in meta:
    changed += _differences(meta['schedule'], expected['schedule'], 'schedule')
  if 'train_steps' in meta:
    changed += _differences(meta['train_steps'], expected['train_steps'], 'train_steps')
  if changed and not allow_schedule_change:
    raise ResumeMismatchError(
        f'Resuming from step {step} in {directory} would change the learning-rate schedule: '
        f'{_join(changed)}. Pass allow_schedule_change (main: --allow_schedule_change) to '
        'continue with the new one, or use the checkpoint\'s values.')
  return changed
