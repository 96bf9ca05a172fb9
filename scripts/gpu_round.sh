#!/usr/bin/env bash
# One GPU round in one call: the CUDA tests, the check against the authors' optimizers on CUDA, then every
# benchmark the Speed page quotes, each part under its own time limit so that one slow part cannot eat the
# others' time. Everything lands under OUTPUT_DIR: a log per part, the benches' .md/.json reports, and
# parts.txt (one line per part: exit status, seconds, limit; 124 means the part hit its limit).
#
#   scripts/gpu_round.sh OUTPUT_DIR [AUTHORS_DIR]     (AUTHORS_DIR: a checkout of AGI-Arena/MARS; without it
#                                                      the check against their optimizers and the timing of
#                                                      their trainers are skipped, saying so)
#
# Budget (seconds, ~570 in all, ~1050 with the authors' trainers: GPU_ROUND_SKIP="... authors_trainers" keeps a
# round under 10 minutes): the tests and the authors' check run side by side (neither is timed); the timed benches
# run one at a time after them. GPU_ROUND_SCALE multiplies every limit; GPU_ROUND_SKIP="name ..." skips parts
# (default: train_autotune, whose compilation alone outlasted a 60 s part on an H200: a round of its own);
# GPU_ROUND_WHEELS=DIR installs the wheels in DIR first (what the GPU machine's image lacks, docs/speed.md);
# GPU_ROUND_DRY_RUN=1 prints each part's command instead of running it.
set -u
out=${1:?usage: scripts/gpu_round.sh OUTPUT_DIR [AUTHORS_DIR]}
authors=${2:-}
scale=${GPU_ROUND_SCALE:-1}
skip=${GPU_ROUND_SKIP-train_autotune}
python=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
small=(--model gpt2-small --batch-size 16 --block-size 1024 --compile --steps 10 --warmup 3 --output-dir "$out")

# part NAME LIMIT_S COMMAND...: runs COMMAND with its output in NAME.log, stopped after LIMIT_S x scale.
part() {
    local name=$1 limit=$(( $2 * scale )) start=$SECONDS rc
    shift 2
    if [[ " $skip " == *" $name "* ]]; then
        echo "$name: skipped (GPU_ROUND_SKIP)" | tee -a "$out/parts.txt"
        return
    fi
    if [ -n "${GPU_ROUND_DRY_RUN:-}" ]; then
        # One write per line: the parts run in the background print side by side.
        echo "$name:$(printf ' %q' "$@")"
        return
    fi
    echo "$(date -u +%H:%M:%S) $name: $*" >>"$out/commands.txt"
    timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc in $(( SECONDS - start )) s (limit $limit s)" | tee -a "$out/parts.txt"
}

if [ -n "${GPU_ROUND_WHEELS:-}" ]; then
    site=${TMPDIR:-/tmp}/gpu_round_site
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$GPU_ROUND_WHEELS"/*.whl || exit
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -n "${GPU_ROUND_DRY_RUN:-}" ] || { nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  "$python" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
    >"$out/device.txt" 2>&1

# Untimed: correctness on CUDA. (A warm-up compile beside them slowed both and finished neither in 130 s.)
workers=$("$python" -c "import xdist" 2>/dev/null && echo "-n 12")
part tests 240 "$python" -m pytest -q -p no:cacheprovider $workers tests/mars tests/model/test_loss.py \
    -rfE --junitxml="$out/tests.xml" &
if [ -n "$authors" ]; then
    part authors 120 "$python" -m scripts.check_against_authors --authors-dir "$authors" --device cuda \
        --output-dir "$out" &
else
    echo "authors: skipped, no checkout of AGI-Arena/MARS given" | tee -a "$out/parts.txt"
fi
wait

# Timed, one at a time.
part newton_schulz 70 "$python" -m scripts.bench_newton_schulz --device cuda --model-size small --compile --reps 10 \
    --output-dir "$out"
part train_optimizers 110 "$python" -m scripts.bench_train "${small[@]}" --tag optimizers --optimizers AdamW \
    "MARS-approx" Muon "Muon CUDA graph" "Muon fused_gram CUDA graph" "Muon ns_batch" "Muon ns_batch CUDA graph" \
    "Muon fused_gram ns_batch CUDA graph" MARS-Shampoo "MARS-Shampoo CUDA graph" "MARS-Shampoo ns_batch CUDA graph"
part train_mfu 60 "$python" -m scripts.bench_train "${small[@]}" --tag mfu --optimizers AdamW --loss-chunk-sizes 0 4096
part train_mars_m 70 "$python" -m scripts.bench_train "${small[@]}" --tag mars_m --optimizers AdamW "MARS-M" \
    "MARS-M CUDA graph" "MARS-M ns_batch CUDA graph" Moonlight
part optimizer_overhead 30 "$python" -m scripts.bench_optimizer --triton-host-overhead --device cuda --reps 200 \
    --warmup 5 --output-dir "$out"
# The authors' train_adamw.py, train_mars.py and train_muon.py beside train.py's presets, one process each under
# torchrun: GPT-2 small's step time on both sides (six compiled runs of 60 steps: minutes).
if [ -n "$authors" ]; then
    part authors_trainers 480 "$python" -m scripts.bench_authors_trainers --authors-dir "$authors" --steps 60 \
        --output-dir "$out"
else
    echo "authors_trainers: skipped, no checkout of AGI-Arena/MARS given" | tee -a "$out/parts.txt"
fi
# Skipped by default: max-autotune compiles for minutes; what it reaches in its time is kept row by row.
part train_autotune 400 "$python" -m scripts.bench_train "${small[@]}" --tag autotune --optimizers AdamW \
    --compile-modes max-autotune-no-cudagraphs
[ -n "${GPU_ROUND_DRY_RUN:-}" ] || cat "$out/parts.txt"
