"""Each experiment's --quick run, once per test session, in a directory every worker sees.

`quick_run(name, out_dir, all_dir)` runs `name` into the session's shared
directory (`shared_all_dir`) unless it is there already, under a lock per
experiment, and copies its JSON and figures into `out_dir`.
tests/experiments/test_all.py then runs `python -m vmoe_sparse_ot.experiments all
--quick --resume` into the same directory: the experiments whose files are there
(run by their own test files, with the same code, in the same session) are not
run again, the others are.
"""
import contextlib
import fcntl
import json
import os
import shutil

import pytest

from vmoe_sparse_ot import experiments


def shared_all_dir(tmp_path_factory) -> str:
  """The session's quick-run directory (under xdist, the workers' temp dirs' parent)."""
  base = tmp_path_factory.getbasetemp()
  root = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base
  path = str(root / 'experiments_quick')
  os.makedirs(path, exist_ok=True)
  return path


@contextlib.contextmanager
def locked(all_dir: str, name: str):
  """Holds `all_dir/NAME.lock` (one writer of an experiment's files at a time)."""
  with open(os.path.join(all_dir, f'{name}.lock'), 'w') as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def quick_run(name: str, out_dir, all_dir: str) -> dict:
  """`name`'s quick run (made once per session in `all_dir`), its files copied to out_dir."""
  payload = None
  with locked(all_dir, name):
    if experiments.finished(name, all_dir, quick=True, seeds=None) is None:
      payload = experiments.run_experiment(name, all_dir, quick=True)
    for f in os.listdir(all_dir):
      if f.startswith(name) and (f.endswith('.png') or f == f'{name}.json'):
        shutil.copy(os.path.join(all_dir, f), os.path.join(str(out_dir), f))
  with open(os.path.join(str(out_dir), f'{name}.json')) as f:
    written = json.load(f)
  assert written['quick'] is True and written['wall_time_s'] > 0
  if payload is not None:
    assert set(payload) == set(written)
  # The table prints without error.
  assert experiments.load(name).format_table(written).strip()
  return written


def pngs(out_dir, name: str) -> list:
  """The PNG files `name` wrote, each checked to be a non-empty PNG."""
  files = sorted(f for f in os.listdir(out_dir) if f.startswith(name) and f.endswith('.png'))
  for f in files:
    with open(os.path.join(out_dir, f), 'rb') as fh:
      assert fh.read(8) == b'\x89PNG\r\n\x1a\n'
  return files


@pytest.fixture(scope='module')
def out_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('experiments')


@pytest.fixture(scope='module')
def all_dir(tmp_path_factory):
  return shared_all_dir(tmp_path_factory)
