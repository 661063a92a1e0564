#!/usr/bin/env bash
# The start-from-weights workflow on the embedded data, measured: pre-train a dense
# ViT on MNIST, upcycle it into the tiny V-MoE with each router, fine-tune on
# scikit-learn's digits at 21 px, evaluate at capacity factors 1.0 and 0.5 with and
# without batch priority, against V-MoEs trained from scratch. Prints one table and
# writes experiments_out/upcycle_finetune.json. Extra arguments go to the
# experiments command, e.g. --seeds=1 or --quick.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# The first training writes the embedded datasets into the local TFDS data_dir.
exec .venv/bin/python -m vmoe_sparse_ot.experiments upcycle_finetune "$@"
