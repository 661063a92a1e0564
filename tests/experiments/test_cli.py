"""The experiments command line: name checks and the one-line error."""
import os
import subprocess
import sys

import pytest

from vmoe_sparse_ot import experiments

PROG = 'python -m vmoe_sparse_ot.experiments'


def test_unknown_name_is_one_line_error_and_exit_status_2():
  proc = subprocess.run([sys.executable, '-m', 'vmoe_sparse_ot.experiments', 'nope'],
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert 'nope' in lines[0] and 'formulations_2d' in lines[0]
  assert 'Traceback' not in proc.stderr


def _fails_in_process(capsys, monkeypatch, *args) -> str:
  """What `python -m vmoe_sparse_ot.experiments ARGS` runs, in this process (no
  interpreter, JAX or TensorFlow start per case): asserts exit status 2 and one
  stderr line; returns that line."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.experiments import __main__ as command  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, 'argv', [command.__file__, *args])
  capsys.readouterr()
  try:
    with pytest.raises(SystemExit) as info:
      command.run()
  finally:
    flags.FLAGS.unparse_flags()
  lines = capsys.readouterr().err.strip().splitlines()
  assert info.value.code == 2 and len(lines) == 1, (info.value.code, lines)
  assert lines[0].startswith(f'{PROG}: error: '), lines
  return lines[0]


def test_an_out_that_is_a_file_or_cannot_be_created_is_one_line_before_running(
    tmp_path, capsys, monkeypatch):
  out = tmp_path / 'results.txt'
  out.write_text('mine')
  line = _fails_in_process(capsys, monkeypatch, 'formulations_2d', '--quick', f'--out={out}')
  assert f"--out='{out}': exists and is not a directory" in line
  too_long = tmp_path / ('x' * 300)
  line = _fails_in_process(capsys, monkeypatch, 'formulations_2d', '--quick', f'--out={too_long}')
  assert f"--out='{too_long}': cannot create it (File name too long" in line
  assert sorted(os.listdir(tmp_path)) == ['results.txt'] and out.read_text() == 'mine'


@pytest.mark.parametrize('args, expected', [
    (['--outt=x'], "Unknown command line flag 'outt'. Did you mean: out ?"),
    (['--seeds=0'], 'flag --seeds=0: 0 is not a positive integer'),
    (['--seeds=two'], "flag --seeds=two: invalid literal for int() with base 10: 'two'"),
])
def test_a_misspelt_flag_or_bad_value_is_one_line(capsys, monkeypatch, tmp_path, args,
                                                  expected):
  assert expected in _fails_in_process(capsys, monkeypatch, 'formulations_2d',
                                       f'--out={tmp_path}', *args)
  assert os.listdir(tmp_path) == []


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
