#!/usr/bin/env bash
# The measurements only an accelerator can show, in one run (about 9 minutes on
# one H100/H200): each router's train step and its ratios (topk/dense,
# sparse_ot/topk), each router alone at the paper's B/32 routing shapes, and the
# OT solver at large sizes against POT on the same machine's CPU.
#
#   bash benchmarks/gpu.sh OUT_DIR     # writes OUT_DIR/{model,router_only,ot}.{txt,json}
#
# Each part has its own time limit, so a failure or overrun in one leaves the
# others' numbers. Sizes: SIZE=small runs the same parts at toy sizes (a check on
# the CPU that the script works).
set -uo pipefail
OUT="${1:?usage: bash benchmarks/gpu.sh OUT_DIR}"
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
ROUTERS=topk,sparse_ot,sparse_ot:candidates,sbase,expert_choice,sinkhorn_ec,soft_moe
if [[ "${SIZE:-full}" == small ]]; then
  MODEL=(--batch 8 --image 32 --patch 8 --hidden 32 --layers 2 --heads 2 --mlp 64 --experts 4 --group_size 17)
  ROUTER=(--batch 8 --image 32 --patch 8 --group_size 17 --experts 4 --k 4)
  OT=(--quick --only '(100,100' --repeats 1)
  T_MODEL=300 T_ROUTER=120 T_OT=120 STEPS=(--rounds 2 --steps 2)
else
  # A V-MoE S/32-sized model (D 512, 8 layers, MLP 2048, E 32, every other block
  # MoE) at 224 px, batch 512: G = 64 groups of S = 400 tokens per MoE layer.
  MODEL=(--batch 512 --image 224 --patch 32 --hidden 512 --layers 8 --heads 8 --mlp 2048
         --experts 32 --group_size 400 --capacity_factor 1.05 --k 16)
  # The paper's B/32 routing shapes (S = 400, E = 32, C = 28, k = 16), batch 4096: G = 512.
  ROUTER=(--batch 4096 --image 224 --patch 32 --group_size 400 --experts 32
          --capacity_factor 1.05 --k 16)
  OT=(--only '(10000,100' --only '(50000' --only '(1000,1000' --only router --repeats 3)
  T_MODEL=280 T_ROUTER=80 T_OT=180 STEPS=(--rounds 5 --steps 10)
fi
"$PY" -c "import jax; print(jax.__version__, jax.devices())" | tee "$OUT/devices.txt"
timeout "$T_MODEL" "$PY" benchmarks/routers.py --routers "$ROUTERS" "${MODEL[@]}" "${STEPS[@]}" \
  --json "$OUT/model.json" 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" | tee "$OUT/model.txt"
timeout "$T_ROUTER" "$PY" benchmarks/routers.py --router-only --routers "$ROUTERS" "${ROUTER[@]}" \
  "${STEPS[@]}" --json "$OUT/router_only.json" 2>&1 | tee "$OUT/router_only.txt"
timeout "$T_OT" "$PY" benchmarks/ot_solvers.py "${OT[@]}" --json "$OUT/ot.json" 2>&1 | tee "$OUT/ot.txt"
