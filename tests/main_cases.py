"""Many `python -m vmoe_sparse_ot.main` command lines in one interpreter.

Each start of the real command pays Python, absl, JAX and TensorFlow imports
(several seconds on a loaded 2-core machine); a test of a one-line error needs
none of that per case. `run_main_cases` starts one child process (this module)
that imports `vmoe_sparse_ot.main` once (during the first case, whose output
is then that of a fresh `python -m vmoe_sparse_ot.main`) and, per command line,
calls its entry point `main.run()` (what `python -m vmoe_sparse_ot.main` calls)
with that `sys.argv`, recording the exit status and what reached file
descriptors 1 and 2 (so C++ and library log lines count, as they would on a
console). Between
cases absl's flags are unparsed and the `--config.*` override flags that
config_flags defined for the previous case are removed.

It is a child process, not pytest's, because absl's global flags allow one
job module per process: `vmoe_sparse_ot.main` and `vmoe_sparse_ot.fewshot` both
define --config (pytest's workers import the latter while collecting).
tests/test_cli.py keeps genuine one-process-per-command tests beside these.
"""
import dataclasses
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Result:
  returncode: int
  stdout: str
  stderr: str


def run_main_cases(argvs, env, timeout=300, cwd=ROOT):
  """Runs each argument list of `argvs` as `python -m vmoe_sparse_ot.main ARGS`; [Result].

  A case may also be (module, argv) for a command line parsed by argparse, whose
  `main(argv)` runs in the same interpreter (`vmoe_sparse_ot.plot`, `.export`,
  `.data`: their flags do not clash with main's).
  """
  with tempfile.TemporaryDirectory() as tmp:
    cases, out = os.path.join(tmp, 'cases.json'), os.path.join(tmp, 'results.json')
    with open(cases, 'w') as f:
      json.dump([[case[0], list(map(str, case[1]))] if isinstance(case, tuple)
                 else list(map(str, case)) for case in argvs], f)
    env = dict(env, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, env.get('PYTHONPATH', '')) if p))  # `tests` from any cwd
    proc = subprocess.run([sys.executable, '-m', 'tests.main_cases', cases, out], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and os.path.exists(out), proc.stderr[-3000:]
    with open(out) as f:
      return [Result(**r) for r in json.load(f)]


def _reset_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  for name in [n for n in flags.FLAGS if n.startswith('config.')]:
    delattr(flags.FLAGS, name)
  flags.FLAGS.unparse_flags()


def _run_one(argv, module_name=None):
  """main.run() with sys.argv = [main.py, *argv] (or `module_name`'s `main(argv)`):
  (exit status, stdout, stderr). The module is imported with the descriptors
  redirected, so what its first import prints (the first case's) is that case's."""
  _reset_flags()
  with tempfile.TemporaryFile('w+') as out, tempfile.TemporaryFile('w+') as err:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    try:
      if module_name is None:
        main = importlib.import_module('vmoe_sparse_ot.main')
        sys.argv = [main.__file__, *argv]
        main.run()
      else:
        module = importlib.import_module(module_name)
        if not hasattr(module, 'main'):  # a package: `python -m` runs its __main__
          module = importlib.import_module(module_name + '.__main__')
        sys.argv = [module.__file__, *argv]
        module.main(list(argv))
      code = 0
    except SystemExit as e:  # What the interpreter would make of it.
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      if not isinstance(e.code, (int, type(None))):
        print(e.code, file=sys.stderr)
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
    finally:
      sys.stdout.flush()
      sys.stderr.flush()
      os.dup2(saved[0], 1)
      os.dup2(saved[1], 2)
      os.close(saved[0])
      os.close(saved[1])
    out.seek(0)
    err.seek(0)
    return {'returncode': code, 'stdout': out.read(), 'stderr': err.read()}


def _child(cases_path, out_path):
  gc.set_threshold(10000, 20, 10)  # As in the test workers (tests/conftest.py).
  with open(cases_path) as f:
    argvs = json.load(f)
  results = []
  for case in argvs:
    if case and isinstance(case[0], str) and len(case) == 2 and isinstance(case[1], list):
      results.append(_run_one(case[1], case[0]))
    else:
      results.append(_run_one(case))
  with open(out_path, 'w') as f:
    json.dump(results, f)


if __name__ == '__main__':
  _child(*sys.argv[1:])
