"""config.profile: which steps the hook profiles, and the trace file a short run writes."""
import glob
import os

import jax
import pytest
from clu import profiler as clu_profiler

from vmoe_sparse_ot.train import profiling
from vmoe_sparse_ot.train import trainer
from tests.train import helpers


def _profile(**kw):
  return {'first_profile': None, 'num_profile_steps': 5, 'every_secs': None,
          'all_processes': False, **kw}


def _started_and_stopped(profile, steps, process_index=0, monkeypatch=None):
  """[('start', step) or ('stop', step)]: before which steps the profile starts and stops."""
  events, current = [], [0]
  monkeypatch.setattr(clu_profiler, 'start', lambda logdir: events.append(('start', current[0])))
  monkeypatch.setattr(clu_profiler, 'stop', lambda: events.append(('stop', current[0])))
  monkeypatch.setattr(jax.profiler, 'stop_trace', lambda: events.append(('close', current[0])))
  hook = profiling.StepProfiler(profile, '/nonexistent', process_index=process_index)
  for step in steps:
    current[0] = step
    hook(step, None)
  hook.close()
  return events


def test_steps_profiled(monkeypatch):
  run = lambda profile, steps=range(1, 11), **kw: _started_and_stopped(
      profile, steps, monkeypatch=monkeypatch, **kw)
  # Steps 3, 4 (before step 3 it starts; before step 5 it stops).
  assert run(_profile(first_profile=3, num_profile_steps=2)) == [('start', 3), ('stop', 5)]
  # Off by default, for 0, and on processes other than 0 unless all_processes.
  assert run(_profile()) == run(_profile(first_profile=0)) == []
  assert run(_profile(first_profile=3), process_index=1) == []
  assert run(_profile(first_profile=3, num_profile_steps=1, all_processes=True),
             process_index=1) == [('start', 3), ('stop', 4)]
  # Training ends inside the profile: it is stopped at the end.
  assert run(_profile(first_profile=8)) == [('start', 8), ('close', 10)]
  # A resumed run past first_profile does not profile.
  assert run(_profile(first_profile=3), steps=range(5, 11)) == []
  # every_secs: again once that long has passed since the last start (here at
  # once), from the step after the stop (as clu's hook).
  assert run(_profile(first_profile=2, num_profile_steps=3, every_secs=1e-9)) == [
      ('start', 2), ('stop', 5), ('start', 6), ('stop', 9), ('start', 10), ('close', 10)]


def _traces(workdir):
  return glob.glob(os.path.join(workdir, 'plugins', 'profile', '*', '*.xplane.pb'))


def test_a_run_writes_the_profile_beside_its_events(topk_six_steps, tmp_path):
  assert _traces(topk_six_steps[0]) == []  # Off by default.
  # The shared run's config for 3 steps (its compiled programs: `profile` and
  # train_steps only drive the loop), profiling step 2.
  workdir = str(tmp_path)
  trainer.train_and_evaluate(
      helpers.small_config('router=topk', **{**helpers.SIX_STEPS, 'train_steps': 3},
                           profile__first_profile=2, profile__num_profile_steps=1),
      workdir, devices=jax.devices()[:1])
  traces = _traces(workdir)
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0
  assert glob.glob(os.path.join(workdir, 'events.out.tfevents.*'))  # The same logdir.


@pytest.mark.parametrize('key,value,message', [
    ('first_profile', -1, 'config.profile.first_profile=-1: must be an integer >= 0 or None'),
    ('num_profile_steps', 0, 'config.profile.num_profile_steps=0: must be an integer >= 1'),
    ('every_secs', 0.0, 'config.profile.every_secs=0.0: must be > 0 or None'),
])
def test_bad_profile_values_are_one_line(key, value, message):
  from vmoe_sparse_ot import config as config_lib  # pylint: disable=import-outside-toplevel
  config = helpers.small_config()
  config.unlock()
  config.profile[key] = value
  with pytest.raises(ValueError) as info:
    config_lib.validate(config)
  assert str(info.value) == message
