#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh) and runs the whole test suite.
#
# Scheduling: one file per worker at a time (--dist loadfile), so a file's
# module-scoped trained fixtures are built once. The files go out in the order
# tests/conftest.py gives them (slowest first, --no-loadscope-reorder), so no
# worker is left alone with a long file at the end. A worker that crashes ends
# the run at once (--max-worker-restart=0): after a replaced worker, xdist's
# loadfile scheduler can wait forever.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder \
  --max-worker-restart=0 -q "$@"
