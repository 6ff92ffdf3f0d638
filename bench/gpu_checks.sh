#!/usr/bin/env bash
# The checks to run when a GPU is lent, in one go (a few minutes on an H200): every command's output in one log,
# OUT/gpu_checks.txt, and its figures as JSON beside it (five files in all, seven with TRACE).
#
#     bash bench/gpu_checks.sh OUT SHAPE [TRACE]
#
# Needs a CUDA device, speclane importable (pip install -e .) and transformers (the hybrid's and the MoE's tensor
# shapes). No model weights go to such a machine: the passes run on random weights of real shapes
# (bench/random_weights.py), SHAPE being the embedded default model's shape alone, made where that model is
# installed: `python -m speclane.bench.random_weights --shape-only --out SHAPE` (a few MB). TRACE, where given: a
# routing trace recorded on text where the MoEfied default model runs (`python -m speclane.bench.routing_trace --out
# TRACE`, a few hundred kB); the expert tier then also runs on a random MoE of the trace's experts and top k, once
# with its own router's choices and once replaying the trace (text's routing), prefetch off in both.
# ONLY="name ..." runs only the steps named (a step's models included: make_moe before expert_tier), to split the
# checks over calls when one call's time limit is shorter than the whole.
set -u
OUT=${1:?usage: bash bench/gpu_checks.sh OUT SHAPE}
SHAPE=${2:?usage: bash bench/gpu_checks.sh OUT SHAPE}
mkdir -p "$OUT"
LOG="$OUT/gpu_checks.txt"
M=$(mktemp -d)
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: the command's output into the log, whatever it returns
    local name=$1 limit=$2
    shift 2
    if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
        return
    fi
    echo "== $name ($(date -u +%H:%M:%S)): $*" | tee -a "$LOG"
    timeout "$limit" "$@" >>"$LOG" 2>&1
    echo "== $name: rc=$?" | tee -a "$LOG"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  git rev-parse --short HEAD 2>/dev/null; } >>"$LOG" 2>&1
step make_smollm2 60 python -m speclane.bench.random_weights --like "$SHAPE" --out "$M/smollm2"
step make_hybrid 90 python -m speclane.bench.random_weights --hybrid --out "$M/hybrid"
step make_moe 150 python -m speclane.bench.random_weights --moe --out "$M/moe"
step host_link 60 python -m speclane.bench.host_link
step cuda_tests 300 python -m pytest -q -p no:cacheprovider tests/round/test_checkpoint_host.py \
    tests/models/test_expert_host_tier.py tests/round/test_expert_cache_rounds.py tests/models/test_triton_route.py \
    tests/kernels/test_rowwise_triton.py tests/kernels/test_gated_delta_triton.py tests/kernels/test_decode_linear.py \
    tests/kernels/test_decode_attention_triton.py -k gpu
step expert_tier 240 python -m speclane.bench.expert_tier --model "$M/moe" --json "$OUT/expert_tier.json"
TRACE=${3:-}
if [ -n "$TRACE" ]; then
    read -r E K < <(python -c "import sys; from speclane.stages.models.routing_trace import RowRouting as T
t = T.load(sys.argv[1]); print(t.experts, t.top_k)" "$TRACE")
    step make_moe_traced 150 python -m speclane.bench.random_weights --moe --experts "$E" --top "$K" --out "$M/moe_k"
    step expert_tier_own 240 python -m speclane.bench.expert_tier --model "$M/moe_k" --prefetch 0 \
        --json "$OUT/expert_tier_own.json"
    step expert_tier_text 240 python -m speclane.bench.expert_tier --model "$M/moe_k" --routing "$TRACE" \
        --json "$OUT/expert_tier_text.json"
fi
step cuda_graphs_smollm2 90 python -m speclane.bench.cuda_graphs --model "$M/smollm2" --profile 1 8 \
    --json "$OUT/cuda_graphs_smollm2.json"
step cuda_graphs_hybrid 90 python -m speclane.bench.cuda_graphs --model "$M/hybrid" --profile 8 \
    --json "$OUT/cuda_graphs_hybrid.json"
step agents 120 python -m speclane.bench.agents --model "$M/smollm2" --device cuda --agents 1 4 --turns 4 \
    --max-tokens 12 --tool-wait 0.2 --json "$OUT/agents.json"
rm -rf "$M"
