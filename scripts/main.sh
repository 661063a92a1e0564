#!/usr/bin/env bash
# The main job on the embedded default data: set up, train the tiny V-MoE with the
# sparse-OT router (the first run writes the embedded datasets into the local TFDS
# data_dir; it evaluates on the test split and prints its accuracy), then few-shot
# linear transfer from the checkpoint, then pictures of the run in $WORKDIR/plots.
# Extra arguments go to the trainer, e.g. --config.train_steps=300; those that set
# few-shot keys (--config.fewshot.*) go to the few-shot step as well.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
WORKDIR="${WORKDIR:-$ROOT/workdirs/vmoe_tiny_mnist_sparse_ot}"
CONFIG="configs/vmoe_tiny_mnist.py:router=sparse_ot"
echo "== Training $CONFIG in $WORKDIR"
.venv/bin/python -m vmoe_sparse_ot.main --config="$CONFIG" --workdir="$WORKDIR" "$@"
echo "== Few-shot linear transfer"
# The checkpoint just trained defines the model, whatever overrides were passed above;
# the few-shot settings are the config's, with the --config.fewshot.* overrides given.
FEWSHOT_ARGS=()
for arg in "$@"; do
  if [[ "$arg" == --config.fewshot.* ]]; then FEWSHOT_ARGS+=("$arg"); fi
done
.venv/bin/python -m vmoe_sparse_ot.fewshot --config="$CONFIG" --workdir="$WORKDIR" \
  --use_checkpoint_config ${FEWSHOT_ARGS[@]+"${FEWSHOT_ARGS[@]}"}
echo "== Plots (curves, expert load, routing, few-shot) in $WORKDIR/plots"
.venv/bin/python -m vmoe_sparse_ot.plot "$WORKDIR"
