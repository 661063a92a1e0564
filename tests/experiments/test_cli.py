"""The experiments command line: name checks and the one-line error."""
import subprocess
import sys

import pytest

from vmoe_sparse_ot import experiments


def test_unknown_name_is_one_line_error_and_exit_status_2():
  proc = subprocess.run([sys.executable, '-m', 'vmoe_sparse_ot.experiments', 'nope'],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert 'nope' in lines[0] and 'formulations_2d' in lines[0]
  assert 'Traceback' not in proc.stderr


def test_check_name():
  assert experiments.check_name('router_study') == 'router_study'
  with pytest.raises(ValueError, match='experiment must be one of'):
    experiments.check_name('all_of_them')
  assert len(experiments.NAMES) == 10


def test_write_json_converts_arrays_and_nan(tmp_path):
  import json

  import numpy as np
  path = tmp_path / 'x.json'
  experiments.write_json(str(path), {'a': np.arange(3), 'b': np.float32(1.5), 'c': float('nan'),
                                     'd': (np.nan, 2.0)})
  assert json.loads(path.read_text()) == {'a': [0, 1, 2], 'b': 1.5, 'c': None, 'd': [None, 2.0]}


def test_known_name_without_module_is_a_value_error(monkeypatch):
  monkeypatch.setattr(experiments, 'NAMES', experiments.NAMES + ('not_written_yet',))
  with pytest.raises(ValueError, match='not available'):
    experiments.load('not_written_yet')


def test_resume_returns_a_finished_run_and_reruns_other_settings(tmp_path):
  first = experiments.run_experiment('color_transfer', str(tmp_path), quick=True)
  again = experiments.run_experiment('color_transfer', str(tmp_path), quick=True, resume=True)
  assert again['resumed'] is True and again['wall_time_s'] == first['wall_time_s']
  assert experiments.finished('color_transfer', str(tmp_path), quick=True, seeds=None)
  # Other settings (or no JSON) are not a finished run.
  assert experiments.finished('color_transfer', str(tmp_path), quick=False, seeds=None) is None
  assert experiments.finished('gaussians_1d', str(tmp_path), quick=True, seeds=None) is None
  (tmp_path / 'color_transfer.json').write_text('{"quick": tr')   # cut short
  assert experiments.finished('color_transfer', str(tmp_path), quick=True, seeds=None) is None
