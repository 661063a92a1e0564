"""One console line per logging interval, and the interval's scalars to the writer.

The host looks at the training metrics only here, on logging steps (and before a
checkpoint is saved): fetching them waits for the device, every other step runs
ahead asynchronously.

Timing excludes compilation: the first step of a run (or of a resumed run) gets
its own line, "compiled and ran in Xs" ("ran in Xs (already compiled)" where an
earlier run in this process compiled the step), as soon as it finishes; steps/s
and the ETA count only the steps after it, and not the time spent in evaluation,
few-shot or checkpoint waits (`paused()`).

Each train row also carries the run's compute accounting (`train.compute`):
`flops_per_step`, and on the timed rows `device_seconds_per_step` and `mfu`.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable

import jax
from absl import logging

from vmoe_sparse_ot.errors import NonFiniteLossError
from vmoe_sparse_ot.train.compute import StepAccounting
from vmoe_sparse_ot.train.metrics import TrainMetrics


def format_duration(seconds: float) -> str:
  seconds = int(round(seconds))
  if seconds >= 3600:
    return f'{seconds // 3600}h{seconds // 60 % 60:02d}m{seconds % 60:02d}s'
  return f'{seconds // 60}m{seconds % 60:02d}s'


class ProgressLogger:
  """Logs on the first step, every `every_steps` and on the last step of `steps`
  (`first_step`, `total_steps`).

  `log(step, metrics)` fetches the device-side `TrainMetrics`, raises
  NonFiniteLossError when a loss or gradient norm of the interval was NaN/Inf,
  writes the interval means (plus learning_rate, steps_per_sec, images_per_sec)
  and prints one line on process 0. `last_good(first_bad_step)` is the error's
  advice on where to resume (`Checkpointer.last_good`). `accounting`: the
  images and compute of a step (`train.compute.StepAccounting`): the rows'
  images_per_sec and compute columns.
  """

  def __init__(self, *, steps: range, every_steps: int, learning_rate: Callable[[int], Any],
               writer, last_good: Callable[[int], str], accounting: StepAccounting,
               compiles: bool = True):
    self.first_step, self.total_steps = steps.start, steps.stop - 1
    self.every_steps, self.batch_size = every_steps, accounting.images_per_step
    self._learning_rate, self._writer, self._last_good = learning_rate, writer, last_good
    self._start = time.monotonic()
    self._paused = 0.0  # Seconds spent paused since the start.
    self._compiled = False  # Whether the first (compiling) step was reported.
    self._compiles = compiles  # Whether that step compiles its program (not kept from before).
    self._accounting = accounting
    self._last_time, self._last_step = 0.0, steps.start - 1
    self.history: list[tuple[int, float]] = []  # (step, mean loss of the interval).
    self.losses: list[float] = []  # Every step's loss.
    self.last_interval: dict[str, Any] | None = None
    self.steady_steps, self.steady_seconds = 0, 0.0

  def _clock(self) -> float:
    return time.monotonic() - self._start - self._paused

  @contextlib.contextmanager
  def paused(self):
    """Time spent inside stays out of steps/s and the ETA."""
    start = time.monotonic()
    try:
      yield
    finally:
      self._paused += time.monotonic() - start

  def should_log(self, step: int) -> bool:
    return (step == self.first_step or step % self.every_steps == 0
            or step == self.total_steps)

  def check_finite(self, step: int, fetched: TrainMetrics, means: dict[str, float]) -> None:
    bad = int(fetched.first_nonfinite_step)
    if bad or not all(map(_isfinite, (means.get('loss', 0.0), means.get('grad_norm', 0.0)))):
      raise NonFiniteLossError(
          f'Non-finite training loss or gradient at step {bad or step}; stopping. '
          f'{self._last_good(bad or step)}')

  def log(self, step: int, metrics: TrainMetrics) -> None:
    fetched = jax.device_get(metrics)  # Waits for the device: the one sync per interval.
    now = self._clock()
    means = fetched.compute()
    self.check_finite(step, fetched, means)
    first, num_steps = self._last_step + 1, step - self._last_step
    elapsed = now - self._last_time
    self._last_step = step
    try:
      self._report(step, fetched, means, first, num_steps, elapsed)
    finally:
      # The next interval starts after this report: its first-time costs (the
      # TensorBoard writer, the schedule's eager ops) stay out of steps/s.
      self._last_time = self._clock()

  def _report(self, step, fetched, means, first, num_steps, elapsed) -> None:
    learning_rate = float(self._learning_rate(step - 1))  # optax counts from 0.
    self.history.append((step, means['loss']))
    self.losses += fetched.step_losses()
    self.last_interval = {'first_step': first, 'last_step': step, **means}
    scalars = dict(means, learning_rate=learning_rate)
    if not self._compiled:  # The first step: compilation and one step.
      self._compiled = True
      self._writer.write_scalars(step, scalars | self._compute(None))
      if jax.process_index() == 0:
        ran = (f'compiled and ran in {elapsed:.1f}s' if self._compiles
               else f'ran in {elapsed:.1f}s (already compiled)')
        logging.info('step %d/%d: %s; loss %.4f, accuracy %.3f; lr %.2e', step,
                     self.total_steps, ran, means['loss'], means['accuracy'], learning_rate)
      return
    self.steady_steps += num_steps
    self.steady_seconds += elapsed
    steps_per_sec = num_steps / max(elapsed, 1e-9)
    steady_rate = self.steady_steps / max(self.steady_seconds, 1e-9)
    scalars.update(steps_per_sec=steps_per_sec,
                   images_per_sec=steps_per_sec * self.batch_size,
                   **self._compute(1 / steps_per_sec))
    self._writer.write_scalars(step, scalars)
    if jax.process_index() == 0:
      span = f'step {first}' if first == step else f'steps {first}-{step}'
      logging.info('step %d/%d: mean of %s: loss %.4f, accuracy %.3f; lr %.2e; %.2f steps/s, '
                   '%.0f images/s; ETA %s', step, self.total_steps, span, means['loss'],
                   means['accuracy'], learning_rate, steps_per_sec,
                   scalars['images_per_sec'],
                   format_duration((self.total_steps - step) / max(steady_rate, 1e-9)))

  def _compute(self, seconds_per_step: float | None) -> dict[str, float]:
    return self._accounting.scalars(seconds_per_step)

  def summary(self) -> dict[str, Any]:
    """What summary.json reports about training (after at least one `log`).

    train_loss_last_interval_mean: the mean loss over train_last_interval_steps
    ([first, last]); final_train_loss is the same value under its older name.
    steps_per_sec / images_per_sec: after the first (compiling) step, pauses
    excluded; absent when the run trained a single step. flops_per_step: per
    device (`train.compute`), when XLA counts it. train_loss_history and
    losses (every step's) are returned but not written to the file.
    """
    interval = self.last_interval
    out = {'train_loss_last_interval_mean': interval['loss'],
           'final_train_loss': interval['loss'],
           'train_last_interval_steps': [interval['first_step'], interval['last_step']],
           'train_loss_history': self.history, 'losses': self.losses}
    if self.steady_steps:
      out['steps_per_sec'] = self.steady_steps / self.steady_seconds
      out['images_per_sec'] = out['steps_per_sec'] * self.batch_size
    if self._accounting.flops_per_step is not None:
      out['flops_per_step'] = self._accounting.flops_per_step
    return out


def _isfinite(x: float) -> bool:
  return x == x and abs(x) != float('inf')
