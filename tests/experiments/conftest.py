"""Runs each experiment's --quick version once per test module, through the dispatcher."""
import json
import os

import pytest

from vmoe_sparse_ot import experiments


def quick_run(name: str, out_dir) -> dict:
  """Runs `name` with quick=True into out_dir; returns the JSON it wrote (read back)."""
  payload = experiments.run_experiment(name, str(out_dir), quick=True)
  path = os.path.join(str(out_dir), f'{name}.json')
  assert os.path.exists(path)
  with open(path) as f:
    written = json.load(f)
  assert written['quick'] is True and written['wall_time_s'] > 0
  assert set(payload) == set(written)
  # The table prints without error and names the experiment.
  assert name in experiments.load(name).format_table(written)
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
