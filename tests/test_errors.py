"""errors: the user-facing error classes, their first line, and how commands report them."""
import pytest

from vmoe_sparse_ot import errors


@pytest.mark.parametrize('error,line', [
    ('one', 'one'),
    ('\n  \nsecond line\nthird', 'second line'),
    (ValueError('bad value\n  details'), 'bad value'),
    (ValueError(''), 'ValueError'),
    (errors.WorkdirLockedError(), 'WorkdirLockedError'),
    ('', "''"),
])
def test_first_line(error, line):
  assert errors.first_line(error) == line


def test_each_error_is_also_the_builtin_its_callers_catch():
  for cls, builtin in ((errors.NonFiniteLossError, FloatingPointError),
                       (errors.ResumeMismatchError, ValueError),
                       (errors.CheckpointRestoreError, FileNotFoundError),
                       (errors.CheckpointWriteError, OSError),
                       (errors.WorkdirLockedError, RuntimeError)):
    assert issubclass(cls, errors.TrainerError) and issubclass(cls, builtin)


def test_fail_prints_one_line_or_all_lines_and_exits_with_the_status(capsys):
  with pytest.raises(SystemExit) as info:
    errors.fail('prog', ValueError('first\n\nsecond'))
  assert info.value.code == 2
  assert capsys.readouterr() == ('', 'prog: error: first\n')
  with pytest.raises(SystemExit) as info:
    errors.fail('prog', 'first\n\nsecond', status=1, first_line_only=False)
  assert info.value.code == 1
  assert capsys.readouterr().err == 'prog: error: first\nsecond\n'


def test_argument_parser_mistakes_are_one_line_and_help_keeps_its_usage(capsys):
  parser = errors.ArgumentParser(prog='prog')
  parser.add_argument('--n', type=int)
  with pytest.raises(SystemExit) as info:
    parser.parse_args(['--m=1'])
  assert info.value.code == 2
  assert capsys.readouterr().err == 'prog: error: unrecognized arguments: --m=1\n'
  with pytest.raises(SystemExit) as info:
    parser.parse_args(['--help'])
  assert info.value.code == 0 and capsys.readouterr().out.startswith('usage: prog [-h]')
