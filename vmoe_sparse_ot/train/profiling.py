"""`config.profile`: a TensorBoard profile (`jax.profiler`) of the training steps it names.

The hook is clu's `periodic_actions.Profile`, as the reference V-MoE trainer's:
called before each train step, it starts `jax.profiler.start_trace(WORKDIR)` before
step `first_profile` and stops it before step `first_profile + num_profile_steps`,
so the profile covers those `num_profile_steps` steps; with `every_secs` it
profiles again once that many seconds have passed since the last start. The trace
goes where the run's TensorBoard events already are, WORKDIR/plugins/profile/
<timestamp>/<host>.xplane.pb, so `tensorboard --logdir WORKDIR` shows it under
"Profile". A profile still open when training ends is stopped then.

Differences from the reference: the profile stops after its steps, without the
reference's (clu's default) minimum of 3 seconds; `all_processes=True` runs the
same step-counted hook on every process (the reference switches to clu's
`ProfileAllHosts`, which records 3 seconds from the trigger). Processes on one
host write the same file name: profile them from one process at a time.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
from absl import logging
from clu import periodic_actions


class StepProfiler:
  """`profiler(step, pending)` before each train step; `profiler.close()` when training ends.

  `pending`: arrays of the steps already dispatched (e.g. the state's step
  counter), waited for before a profile stops, so it holds their device work.
  """

  def __init__(self, profile: Mapping[str, Any], logdir: str,
               process_index: int | None = None):
    first = profile['first_profile']
    process_index = jax.process_index() if process_index is None else process_index
    self._hook = None
    self._steps = int(profile['num_profile_steps'])
    self._stop_at = None  # The step before which the open profile stops.
    if first and (profile['all_processes'] or process_index == 0):
      self._hook = periodic_actions.Profile(
          logdir=logdir, num_profile_steps=self._steps, profile_duration_ms=None,
          first_profile=int(first), every_steps=None, every_secs=profile['every_secs'])
      every = profile['every_secs']
      logging.info('Profiling steps %d-%d%s into %s', first, first + self._steps - 1,
                   f', again every {every:g} s' if every else '', logdir)

  def __call__(self, step: int, pending: Any = None) -> None:
    if self._hook is None:
      return
    if self._stop_at is not None:
      if step < self._stop_at:
        return  # Profiling: not started again before it stops, whatever every_secs says.
      jax.block_until_ready(pending)  # The hook stops the profile now.
      self._stop_at = None
    if self._hook(step):  # Started a profile.
      self._stop_at = step + self._steps

  def close(self) -> None:
    """Stops a profile still open (training ended inside its steps)."""
    if self._stop_at is not None:
      jax.profiler.stop_trace()
      self._stop_at = None
