#!/usr/bin/env bash
# The main job on the embedded default data: set up, train the tiny V-MoE with the
# sparse-OT router (the first run writes the embedded datasets into the local TFDS
# data_dir; it evaluates on the test split and prints its accuracy), then few-shot
# linear transfer from the checkpoint, then pictures of the run in $WORKDIR/plots:
# all three in one process (python -m vmoe_sparse_ot.quickstart).
# Extra arguments go to the trainer, e.g. --config.train_steps=300; the few-shot
# step uses the same config (its --config.fewshot.* overrides too) with the model
# of the checkpoint just trained.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
WORKDIR="${WORKDIR:-$ROOT/workdirs/vmoe_tiny_mnist_sparse_ot}"
CONFIG="configs/vmoe_tiny_mnist.py:router=sparse_ot"
echo "== Training $CONFIG in $WORKDIR"
exec .venv/bin/python -m vmoe_sparse_ot.quickstart --config="$CONFIG" --workdir="$WORKDIR" "$@"
