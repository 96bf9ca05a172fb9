#!/usr/bin/env bash
# One GPU round in one call: the CUDA tests, the check against the authors' optimizers on CUDA, then every
# benchmark the Speed page quotes, each part under its own time limit so that one slow part cannot eat the
# others' time. Everything lands under OUTPUT_DIR: a log per part, the benches' .md/.json reports, and
# parts.txt (one line per part: exit status, seconds, limit; 124 means the part hit its limit).
#
#   scripts/gpu_round.sh OUTPUT_DIR [AUTHORS_DIR]     (AUTHORS_DIR: a checkout of AGI-Arena/MARS; without it
#                                                      the check against their optimizers is skipped, saying so)
#
# Budget (seconds, ~550 in all): tests and the authors' check run side by side with a warm-up compile (none of
# them is timed); the timed benches run one at a time after them. GPU_ROUND_SCALE multiplies every limit.
set -u
out=${1:?usage: scripts/gpu_round.sh OUTPUT_DIR [AUTHORS_DIR]}
authors=${2:-}
scale=${GPU_ROUND_SCALE:-1}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
small=(--model gpt2-small --batch-size 16 --block-size 1024 --compile --steps 10 --warmup 3 --output-dir "$out")

# part NAME LIMIT_S COMMAND...: runs COMMAND with its output in NAME.log, stopped after LIMIT_S x scale.
part() {
    local name=$1 limit=$(( $2 * scale )) start=$SECONDS rc
    shift 2
    echo "$(date -u +%H:%M:%S) $name: $*" >>"$out/commands.txt"
    timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc in $(( SECONDS - start )) s (limit $limit s)" | tee -a "$out/parts.txt"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
    >"$out/device.txt" 2>&1

# Untimed: correctness on CUDA, and a compile of GPT-2 small that fills the inductor cache for the benches.
workers=$("$python" -c "import xdist" 2>/dev/null && echo "-n 8")
part tests 130 "$python" -m pytest -q -p no:cacheprovider $workers tests/mars tests/model/test_loss.py \
    --junitxml="$out/tests.xml" &
if [ -n "$authors" ]; then
    part authors 130 "$python" -m scripts.check_against_authors --authors-dir "$authors" --device cuda \
        --output-dir "$out" &
else
    echo "authors: skipped, no checkout of AGI-Arena/MARS given" | tee -a "$out/parts.txt"
fi
part warm_compile 130 "$python" -m scripts.bench_train "${small[@]}" --steps 1 --warmup 1 --optimizers AdamW \
    --loss-chunk-sizes 0 4096 --output-dir "$out/warm_compile" &
wait

# Timed, one at a time.
part newton_schulz 90 "$python" -m scripts.bench_newton_schulz --device cuda --model-size small --compile --reps 10 \
    --output-dir "$out"
part train_optimizers 100 "$python" -m scripts.bench_train "${small[@]}" --tag optimizers --optimizers AdamW \
    "MARS-AdamW approx" Muon "Muon CUDA graph" "Muon fused_gram CUDA graph" MARS-Shampoo "MARS-Shampoo CUDA graph"
part train_mfu 60 "$python" -m scripts.bench_train "${small[@]}" --tag mfu --optimizers AdamW --loss-chunk-sizes 0 4096
part train_mars_m 70 "$python" -m scripts.bench_train "${small[@]}" --tag mars_m --optimizers AdamW "MARS-M approx" \
    "MARS-M approx CUDA graph" Moonlight
part optimizer_overhead 40 "$python" -m scripts.bench_optimizer --triton-host-overhead --device cuda --reps 200 \
    --warmup 5 --output-dir "$out"
# Last: max-autotune compiles for minutes; what it reaches in its time is kept row by row.
part train_autotune 60 "$python" -m scripts.bench_train "${small[@]}" --tag autotune --optimizers AdamW \
    --compile-modes max-autotune-no-cudagraphs
cat "$out/parts.txt"
