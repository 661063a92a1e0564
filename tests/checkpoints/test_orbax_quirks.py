"""checkpoints.orbax_quirks: Orbax's log lines and event loops tamed, each on its own."""
import asyncio
import logging
import sys
import types

from vmoe_sparse_ot.checkpoints import orbax_quirks


def _record(pathname, level, message='m'):
  return logging.LogRecord('x', level, pathname, 1, message, None, None)


def test_orbax_errors_are_dropped_and_nothing_else():
  keep = orbax_quirks.DropOrbaxErrors().filter
  assert not keep(_record('/site-packages/orbax/checkpoint/async_checkpointer.py', logging.ERROR))
  assert keep(_record('/site-packages/orbax/checkpoint/async_checkpointer.py', logging.WARNING))
  assert keep(_record('/site-packages/vmoe_sparse_ot/checkpoints/store.py', logging.ERROR))


def test_a_loop_made_inside_draining_loops_finishes_its_tasks_before_closing():
  finished = []

  async def read(delay, fail):
    await asyncio.sleep(delay)
    finished.append(delay)
    if fail:
      raise OSError('damaged')

  async def restore():
    # As asyncio.gather in a restore: the first failure raises at once.
    await asyncio.gather(read(0, True), read(0.05, False))

  with orbax_quirks.draining_loops():
    loop = asyncio.new_event_loop()
  assert isinstance(loop, orbax_quirks._DrainingEventLoop)  # pylint: disable=protected-access
  try:
    loop.run_until_complete(restore())
  except OSError:
    pass
  assert finished == [0]          # The slower read is still pending...
  loop.close()
  assert finished == [0, 0.05]    # ...and closing let it finish.
  plain = asyncio.new_event_loop()   # Outside: the default policy again.
  assert not isinstance(plain, orbax_quirks._DrainingEventLoop)  # pylint: disable=protected-access
  plain.close()


def test_closed_event_loop_errors_are_quiet_and_other_unraisables_are_not(monkeypatch):
  seen = []
  monkeypatch.setattr(sys, 'unraisablehook', seen.append)
  orbax_quirks.quiet_closed_event_loop()
  orbax_quirks.quiet_closed_event_loop()   # Installed once, not wrapped twice.
  closed = types.SimpleNamespace(exc_value=RuntimeError('Event loop is closed'))
  other = types.SimpleNamespace(exc_value=RuntimeError('something else'))
  sys.unraisablehook(closed)
  sys.unraisablehook(other)
  assert seen == [other]


def test_abandoned_writes_under_a_failed_step_are_not_logged(monkeypatch):
  monkeypatch.setattr(sys, 'unraisablehook', sys.unraisablehook)
  asyncio_logger = logging.getLogger('asyncio')
  monkeypatch.setattr(asyncio_logger, 'filters', list(asyncio_logger.filters))
  abandoned = orbax_quirks._ABANDONED_READS  # pylint: disable=protected-access
  monkeypatch.setattr(abandoned, 'paths', set())
  orbax_quirks.quiet_abandoned_io('/w/checkpoints/8.orbax-checkpoint-tmp-1/')
  keep = asyncio_logger.filter
  assert not keep(_record('asyncio', logging.ERROR, 'Future exception was never retrieved '
                          'in /w/checkpoints/8.orbax-checkpoint-tmp-1/params'))
  assert keep(_record('asyncio', logging.ERROR, 'Future exception was never retrieved '
                      'in /w/checkpoints/9/params'))
  assert keep(_record('asyncio', logging.ERROR, 'other /w/checkpoints/8.orbax-checkpoint-tmp-1/'))
