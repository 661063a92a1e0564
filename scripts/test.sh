#!/usr/bin/env bash
# Sets up the environment (scripts/setup.sh) and runs the whole test suite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
exec .venv/bin/python -m pytest -n 2 --dist loadfile -q "$@"
