#!/usr/bin/env bash
# The measurements only an accelerator can show, in one run of at most 9.8 minutes
# of limits (about 8 expected on one H200, from 2026-11-28), most wanted first (issue 40):
#   1. pallas       the router's solve alone, 'fast' against the kernel's variants
#                   (-inc: the incremental selection, first; block layout mn, nm;
#                   nm-reload: costs read at each use) at 4 and 8 Triton warps (16
#                   was 3.5x slower than 4 on 2026-11-28), with the plans' largest
#                   difference, at G = 64 (one MoE layer of the model below: fewer
#                   programs than SMs) and G = 512 (the router alone, below)
#   2. router_only  each router alone at the paper's B/32 routing shapes (G = 512):
#                   topk against sparse_ot's Newton (its default, 10 steps) and
#                   Adam-50's 'fast' and 'pallas' (the fused kernel as part 1 found
#                   fastest at G = 512)
#   3. model        the S/32-sized train step: dense, dense_active, topk, sparse_ot
#                   Newton, Adam-50 'fast' and 'pallas' (the kernel as part 1 found
#                   fastest at the model's G = 64), and their ratios
#   4. moe          where one TopK MoE layer's time goes beyond a dense MLP's at the
#                   model's shapes: the layer with each dispatcher (indices, einsum,
#                   einsum in bfloat16), and its router, dispatch + combine and
#                   experts alone (item 5: topk / dense <= 1.25x, or where the rest goes)
#   5. memory       benchmarks/memory.py's levers at B/16 (all, then plain), batch 4096 on
#                   this device (B/32's plain, remat_bf16 and all: RESULTS.md)
# Four more parts do not fit in the same call; a second call in the same lease
# (a few minutes of device time left) runs them by name, in this order:
#   ot_probe        where ot.solve's time goes at (10000, 100, k = 100) in float64,
#                   and the column top-k it runs: radix selection against lax.top_k
#   share           B/32 with all levers at batch 512 on this one device: the share
#                   of each of 8 devices in the paper's batch of 4096, with all 32
#                   experts held here (on 8 devices each holds 32 / its 'expert'
#                   axis), so a bound on the 8-device split's memory up to the
#                   buffers of its collectives (the 16 GiB target)
#   ot_solvers      benchmarks/ot_solvers.py's grid rows, (2000, 10, 230) and the
#                   router batch, each first call and warm, POT on the host (POT
#                   carried as a wheel, like ml_collections)
#   levers          benchmarks/memory.py's single levers at B/32 (remat, bf16,
#                   microsteps4)
#
#   bash benchmarks/gpu.sh OUT_DIR [PARTS]   # writes OUT_DIR/log.txt (everything
#       # printed) and one OUT_DIR/<part>.json per part; PARTS: comma-separated
#       # names (default: pallas,router_only,model,moe,memory), e.g.
#   bash benchmarks/gpu.sh OUT_DIR2 ot_probe,share,ot_solvers,levers
#
# Targets (issue 56): sparse_ot alone <= 3x topk alone at G = 512 (router_only),
# its train step <= 1.15x topk's (model), for Newton and the fused kernel. Each part has its own time limit, so a failure or
# overrun in one leaves the others' numbers; a router that fails to build or
# compile is reported and skipped (benchmarks/routers.py). Rows measured on the
# H200 before (2026-11-26: 'candidates', sbase, expert_choice, sinkhorn_ec,
# soft_moe) are left out to fit the time. Needs ml_collections beside the
# machine's JAX, and POT for ot_solvers, carried as wheels for its Python, e.g.
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 -d .whl ml-collections==1.1.0 pot==0.9.7.post1
# and installed there with pip install --no-index --no-deps --target DIR .whl/*.whl
# (DIR on PYTHONPATH). SIZE=small runs the
# same parts at toy sizes: a check on the CPU that the script works ('pallas'
# runs there in Pallas interpret mode).
set -uo pipefail
[[ $# -ge 1 && -n "$1" ]] || { echo "usage: bash benchmarks/gpu.sh OUT_DIR [PARTS]" >&2; exit 2; }
OUT="$1"
FIRST_CALL=pallas,router_only,model,moe,memory
ALL_PARTS=$FIRST_CALL,ot_probe,share,ot_solvers,levers
PARTS="${2:-$FIRST_CALL}"
listed() { [[ ",$2," == *",$1,"* ]]; }   # listed NAME LIST: NAME is in the comma list
for p in ${PARTS//,/ }; do
  listed "$p" "$ALL_PARTS" || {
    echo "gpu.sh: unknown part '$p' in PARTS; parts: ${ALL_PARTS//,/, }" >&2; exit 2; }
done
wanted() { listed "$1" "$PARTS"; }
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
PY="${PYTHON:-python3}"
LOG="$OUT/log.txt"
START=$SECONDS
ALONE=topk,sparse_ot:newton,sparse_ot:fast,sparse_ot:pallas
ROUTERS=topk,sparse_ot:newton,sparse_ot:fast,sparse_ot:pallas
if [[ "${SIZE:-full}" == small ]]; then
  MODEL=(--batch 8 --image 32 --patch 8 --hidden 32 --layers 2 --heads 2 --mlp 64 --experts 4 --group_size 17)
  ROUTER=(--batch 8 --image 32 --patch 8 --group_size 17 --experts 4 --k 4)
  PROBE=(--groups 2,4 --group_size 40 --experts 8 --k 4 --warps 4,8 --repeats 1)
  KERNEL_G=2 ALONE_G=4
  MOE=(--batch 8 --tokens 50 --hidden 32 --mlp 64 --experts 4 --group_size 40 --repeats 2)
  MEMORY=(--config vmoe_b32 --rows plain --batch_size 16)
  LEVERS=(--config vmoe_b32 --rows remat --batch_size 16)
  SHARE=(--config vmoe_b32 --rows all --batch_size 32)
  SOLVERS=(--quick --repeats 1 --only '(100,100' --only router)
  T_ROUTER=120 T_PALLAS=60 T_MODEL=300 T_MOE=120 T_OT_PROBE=120 T_MEMORY=240
  T_SOLVERS=240 T_LEVERS=240 T_SHARE=240
  STEPS=(--rounds 2 --steps 2)
else
  # The paper's B/32 routing shapes (S = 400, E = 32, C = 28, k = 16), batch 4096: G = 512.
  ROUTER=(--batch 4096 --image 224 --patch 32 --group_size 400 --experts 32
          --capacity_factor 1.05 --k 16)
  PROBE=(--groups 64,512 --group_size 400 --experts 32 --k 16 --warps 4,8 --repeats 10)
  KERNEL_G=64 ALONE_G=512   # the model's groups per MoE layer; the router alone's
  # A V-MoE S/32-sized model (D 512, 8 layers, MLP 2048, E 32, every other block
  # MoE) at 224 px, batch 512: G = 64 groups of S = 400 tokens per MoE layer.
  MODEL=(--batch 512 --image 224 --patch 32 --hidden 512 --layers 8 --heads 8 --mlp 2048
         --experts 32 --group_size 400 --capacity_factor 1.05 --k 16)
  # The same model's MoE layer alone: batch 512 x 50 tokens (the defaults of --part moe).
  MOE=(--repeats 10)
  MEMORY=(--config vmoe_b16 --rows all,plain)   # "all" first: the 16 GiB target
  # Taken on the H200 (2026-11-28): router_only 31 s, pallas 17 s (then one G, one
  # layout, three warp counts; now 2 G x 5 variants x 2 warp counts), model 170+ s
  # (five compiles of ~30 s), ot_probe 65 s, memory 50-67 s a row (so B/16's second
  # row may not fit); moe is new (ten one-layer compiles).
  T_ROUTER=60 T_PALLAS=140 T_MODEL=210 T_MOE=60 T_MEMORY=90
  # The second call's parts (the (10000, 100) and larger rows: ot_probe's study).
  T_OT_PROBE=70 T_SHARE=80
  SHARE=(--config vmoe_b32 --rows all --batch_size 512)
  LEVERS=(--config vmoe_b32 --rows remat,bf16,microsteps4)
  SOLVERS=(--repeats 1 --only '(100,100' --only '(500,500' --only '(1000,1000'
           --only '(2000,64' --only '(2000,10,' --only router)
  T_SOLVERS=150 T_LEVERS=180
  STEPS=(--rounds 5 --steps 10)
fi

part() {  # part NAME LIMIT_S COMMAND...: runs COMMAND under its limit, output into the log
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit} s, at $((SECONDS - START)) s)" | tee -a "$LOG"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v "^WARNING\|^I0000\|^W0000\|UserWarning\|warnings.warn" \
    | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  [[ $rc == 124 ]] && echo "== $name: stopped at its time limit" | tee -a "$LOG"
  [[ $rc != 0 && $rc != 124 ]] && echo "== $name: exit status $rc" | tee -a "$LOG"
  return 0
}

: > "$LOG"
part devices 30 "$PY" -c "import jax; print('JAX', jax.__version__, jax.devices())"
wanted pallas && part pallas "$T_PALLAS" "$PY" benchmarks/gpu_probe.py --part pallas \
  "${PROBE[@]}" --json "$OUT/pallas.json"
# The fused kernel as the pallas part found fastest with correct plans at G groups
# (empty, so the kernel's defaults, if that part measured none).
fastest() {
  "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' \
    "$OUT/pallas.json" "G$1/fastest" 2>/dev/null
}
if wanted router_only; then
  KERNEL=$(fastest "$ALONE_G")
  echo "== router_only: sparse_ot:pallas runs the kernel as ${KERNEL:-its defaults}" | tee -a "$LOG"
  part router_only "$T_ROUTER" "$PY" benchmarks/routers.py --router-only \
    --routers "$ALONE" "${ROUTER[@]}" ${KERNEL:+--pallas_kernel "$KERNEL"} "${STEPS[@]}" \
    --json "$OUT/router_only.json"
fi
if wanted model; then
  KERNEL=$(fastest "$KERNEL_G")
  echo "== model: sparse_ot:pallas runs the kernel as ${KERNEL:-its defaults}" | tee -a "$LOG"
  part model "$T_MODEL" "$PY" benchmarks/routers.py --routers "$ROUTERS" "${MODEL[@]}" \
    ${KERNEL:+--pallas_kernel "$KERNEL"} "${STEPS[@]}" --json "$OUT/model.json"
fi
wanted moe && part moe "$T_MOE" "$PY" benchmarks/gpu_probe.py --part moe "${MOE[@]}" \
  --json "$OUT/moe.json"
wanted ot_probe && part ot_probe "$T_OT_PROBE" "$PY" benchmarks/gpu_probe.py --part ot \
  --repeats 1 --json "$OUT/ot_probe.json"
wanted memory && part memory "$T_MEMORY" "$PY" benchmarks/memory.py "${MEMORY[@]}" \
  --json "$OUT/memory.json"
wanted share && part share "$T_SHARE" "$PY" benchmarks/memory.py "${SHARE[@]}" \
  --json "$OUT/share.json"
wanted ot_solvers && part ot_solvers "$T_SOLVERS" "$PY" benchmarks/ot_solvers.py \
  "${SOLVERS[@]}" --json "$OUT/ot_solvers.json"
wanted levers && part levers "$T_LEVERS" "$PY" benchmarks/memory.py "${LEVERS[@]}" \
  --json "$OUT/levers.json"
echo "== done at $((SECONDS - START)) s" | tee -a "$LOG"
