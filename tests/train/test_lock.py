"""train.lock: one trainer per workdir; a dead holder's lock is taken over."""
import logging
import os
import signal
import subprocess
import sys
import textwrap

import jax
import pytest

from vmoe_sparse_ot import errors
from vmoe_sparse_ot.train import lock as lock_lib
from vmoe_sparse_ot.train import trainer
from tests.train import helpers


HOLD_LOCK = textwrap.dedent('''
    import sys, time
    from vmoe_sparse_ot.train import lock
    lock.WorkdirLock(sys.argv[1]).acquire()
    print('locked', flush=True)
    time.sleep(120)
''')


def _hold_lock(workdir):
  proc = subprocess.Popen([sys.executable, '-c', HOLD_LOCK, workdir], cwd=helpers.ROOT,
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == 'locked'
  return proc


def test_second_trainer_on_a_workdir_is_refused_and_a_dead_holder_is_taken_over(tmp_path,
                                                                                 caplog):
  workdir = str(tmp_path)
  holder = _hold_lock(workdir)
  try:
    with pytest.raises(errors.WorkdirLockedError,
                       match=rf'^Workdir {workdir} is in use by another trainer \(pid '
                             rf'{holder.pid} on .*\); wait for it to finish') as e:
      trainer.train_and_evaluate(helpers.small_config(), workdir, devices=jax.devices()[:1])
    assert '\n' not in str(e.value)
    assert not os.path.exists(os.path.join(workdir, 'checkpoints'))  # Refused before any work.
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # The killed holder's record is still in the file, but the kernel dropped its lock.
  caplog.set_level(logging.WARNING)
  with lock_lib.WorkdirLock(workdir):
    assert any(f'left by pid {holder.pid}' in r.getMessage() for r in caplog.records)
    # While we hold it, a second process is refused, and is told our pid.
    second = subprocess.run([sys.executable, '-c', HOLD_LOCK, workdir], cwd=helpers.ROOT,
                            capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert f'in use by another trainer (pid {os.getpid()} on' in second.stderr
  # Processes of one multi-process run lock separate files.
  with lock_lib.WorkdirLock(workdir, 0), lock_lib.WorkdirLock(workdir, 1):
    pass
