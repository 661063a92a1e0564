"""The periodic actions of the training loop, one function each.

Each returns a clu `PeriodicCallback` that the loop calls after every step as
`hook(step, state=TrainState, metrics=TrainMetrics)`; it runs on its own
schedule, with the progress clock paused (`ProgressLogger.paused`), so that
steps/s counts training alone.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
from clu import periodic_actions

from vmoe_sparse_ot.errors import NonFiniteLossError
from vmoe_sparse_ot.train import periodic_eval
from vmoe_sparse_ot.train.progress import ProgressLogger


def checkpoint_every(every_steps: int, last_step: int, ckpt: Any, record: dict[str, Any],
                     all_finite: Callable[[Any], jax.Array],
                     progress: ProgressLogger) -> periodic_actions.PeriodicCallback:
  """Saves the state with the run record (and its step) every `every_steps` and at
  `last_step`, after checking it is finite: a non-finite state or interval raises
  NonFiniteLossError naming the step and the last good checkpoint, and is never
  written, so the last checkpoint stays a good one."""

  def save(step, t, state, metrics):
    del t
    with progress.paused():
      finite, bad = jax.device_get((all_finite(state), metrics.first_nonfinite_step))
      if not finite or bad:
        what = 'training loss or gradient' if bad else 'parameters or optimizer state'
        # Non-finite parameters after `step` make the loss of step + 1 non-finite.
        raise NonFiniteLossError(f'Non-finite {what} at step {int(bad) or step}; stopping. '
                                 f'{ckpt.last_good(int(bad) or step + 1)}')
      ckpt.save(step, state, dict(record, step=step))

  return periodic_actions.PeriodicCallback(every_steps=every_steps, on_steps=[last_step],
                                           callback_fn=save)


def evaluate_every(every_steps: int, last_step: int,
                   run_eval: Callable[[Any], dict[str, dict[str, float]]],
                   eval_sets: Sequence[periodic_eval.EvalSet], writer: Any,
                   progress: ProgressLogger) -> periodic_actions.PeriodicCallback:
  """Evaluates every set (`run_eval(state)`: {set name: result}) every `every_steps`
  (0: never) and at `last_step`, and logs the results; `get_last_callback_result()`
  is the latest results."""

  def evaluate(step, t, state, metrics):
    del t, metrics
    with progress.paused():
      start = time.monotonic()
      results = run_eval(state)
      periodic_eval.log_results(step, results, eval_sets, writer, time.monotonic() - start)
    return results

  return periodic_actions.PeriodicCallback(every_steps=every_steps or None,
                                           on_steps=[last_step], callback_fn=evaluate)


def fewshot_every_step(fewshot: Callable[..., Any],
                       progress: ProgressLogger) -> periodic_actions.PeriodicCallback:
  """Offers every step to `fewshot(step, params, model_state)`, a periodic few-shot
  evaluator that keeps its own schedule (`evaluate.transfer.PeriodicFewShot`); it
  routes with the state's router state, as evaluation does."""

  def few_shot(step, t, state, metrics):
    del t, metrics
    with progress.paused():
      fewshot(step, state.params, state.model_state)

  return periodic_actions.PeriodicCallback(every_steps=1, callback_fn=few_shot)
