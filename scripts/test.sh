#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh) and runs the whole test suite.
#
# Scheduling: one file per worker at a time (--dist loadfile), so a file's
# module-scoped trained fixtures are built once. The files go out in the order
# tests/conftest.py gives them (slowest first, --no-loadscope-reorder), so no
# worker is left alone with a long file at the end.
#
# A worker that dies (a fatal signal in native code: rare, never the same test)
# is replaced, and the test it was running runs once more on the new worker
# (tests/crash_recovery.py). Only crashes are retried: the --only-rerun pattern
# matches no ordinary failure, so a failing assertion fails at once. A second
# crash of the same test, or a third crashed worker, fails the run.
#
# Where the time goes (mostly XLA compilation): add `-p tests.compile_profile`
# (see that file) for each test's wall and compile seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder \
  --max-worker-restart=2 --reruns 1 --only-rerun '^$ only crashes are retried' \
  -q "$@"
