"""A test whose worker process dies is run again once, on a fresh worker.

An xdist worker died of a fatal signal in two CI runs and one full run here,
each time in a different test that passes when run again; the one stack kept
shows SIGABRT inside XLA:CPU's deserialization of a persistent compilation
cache entry. The tests no longer use that cache (tests/train/conftest.py); this
stays as the safety net for native crashes. One such crash must not cost the
whole run, and it must not hang it either:

- pytest-rerunfailures asks the scheduler to put a crashed test back in the
  queue (`mark_test_pending`) and reports the first attempt as a rerun, not a
  failure. scripts/test.sh passes `--reruns 1 --only-rerun <no ordinary
  failure>`, so only crashes are retried: a test that fails by assertion or
  exception still fails at once.
- xdist 3.8.0's file scheduler (`--dist loadfile`) does not support that, and
  after a worker is replaced it also puts the dead worker's finished files
  back in the queue as empty work, then waits for them forever. The scheduler
  below re-queues only what the dead worker had not run, and accepts a crashed
  test back.

A test that crashes its worker twice still fails, naming the test.
"""
import pytest


def make_scheduler(config, log):
  """A loadfile scheduler that survives a crashed worker (see module doc)."""
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  class CrashTolerantLoadFileScheduling(LoadFileScheduling):
    """LoadFileScheduling whose crash handling re-queues only unrun tests."""

    def remove_node(self, node):
      workload = self.assigned_work.pop(node)
      unrun = {}
      for scope, work_unit in workload.items():
        pending = {nodeid: False for nodeid, done in work_unit.items() if not done}
        if pending:
          unrun[scope] = pending
      if not unrun:
        return None
      # The first test not finished is the one that was running: xdist reports
      # it, and pytest-rerunfailures may hand it back through mark_test_pending.
      first_scope = next(iter(unrun))
      crashitem = next(iter(unrun[first_scope]))
      del unrun[first_scope][crashitem]
      if not unrun[first_scope]:
        del unrun[first_scope]
      self._requeue_first(unrun)
      return crashitem

    def mark_test_pending(self, item):
      self._requeue_first({self._split_scope(item): {item: False}})

    def _requeue_first(self, units):
      """Put work units at the front of the queue.

      Nothing is handed out here: the replacement worker's start calls
      schedule(), which hands work to every worker. (Handing it out now could
      give the dead worker's file to a live worker before the crashed test is
      added back to it.)
      """
      for scope, work_unit in reversed(list(units.items())):
        if scope in self.workqueue:
          work_unit = {**work_unit, **self.workqueue[scope]}
        self.workqueue[scope] = work_unit
        self.workqueue.move_to_end(scope, last=False)

  return CrashTolerantLoadFileScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  if config.getvalue("dist") == "loadfile":
    return make_scheduler(config, log)
  return None
