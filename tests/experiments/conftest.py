"""Runs each experiment's --quick version once per test module, through the dispatcher.

tests/experiments/test_all.py runs `python -m vmoe_sparse_ot.experiments all --quick`
into a directory that every pytest worker of the session sees (`shared_all_dir`).
`quick_run` takes an experiment's files from there when that run has written them
(its JSON comes last), instead of running the experiment a second time; otherwise
(a file run alone, or before test_all got there) it runs the experiment itself.
"""
import json
import os
import shutil

import pytest

from vmoe_sparse_ot import experiments


def shared_all_dir(tmp_path_factory) -> str:
  """The session's `all --quick` output directory (the workers' temp dirs' parent)."""
  base = tmp_path_factory.getbasetemp()
  # Under pytest-xdist each worker has basetemp/popen-gwN; their parent is shared.
  root = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base
  return str(root / 'experiments_all_quick')


def _from_all_run(name: str, out_dir, all_dir: str) -> bool:
  """Copies `name`'s JSON and figures from a finished `all --quick` run; False if none."""
  path = os.path.join(all_dir, f'{name}.json')
  try:
    with open(path) as f:
      if json.load(f).get('quick') is not True:
        return False
  except (OSError, ValueError):
    return False
  for f in os.listdir(all_dir):
    if f.startswith(name) and (f.endswith('.png') or f == f'{name}.json'):
      shutil.copy(os.path.join(all_dir, f), os.path.join(str(out_dir), f))
  return True


def quick_run(name: str, out_dir, all_dir: str | None = None) -> dict:
  """`name` with quick=True into out_dir (or its files from the `all` run); its JSON read back."""
  payload = None
  if not (all_dir and _from_all_run(name, out_dir, all_dir)):
    payload = experiments.run_experiment(name, str(out_dir), quick=True)
  path = os.path.join(str(out_dir), f'{name}.json')
  assert os.path.exists(path)
  with open(path) as f:
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
