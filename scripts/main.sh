#!/usr/bin/env bash
# The main job on the embedded default data: set up, train the tiny V-MoE on the
# embedded MNIST with the sparse-OT router, evaluate, then few-shot transfer.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
WORKDIR="${WORKDIR:-$ROOT/workdirs/vmoe_tiny_mnist_sparse_ot}"
.venv/bin/python -m vmoe_sparse_ot.main \
  --config="configs/vmoe_tiny_mnist.py:router=sparse_ot" --workdir="$WORKDIR" "$@"
.venv/bin/python -m vmoe_sparse_ot.fewshot \
  --config="configs/vmoe_tiny_mnist.py:router=sparse_ot" --workdir="$WORKDIR"
