#!/usr/bin/env bash
# Train on every GPU of this machine: scripts/launch_single_node.sh [Hydra overrides...]
#   scripts/launch_single_node.sh model=gpt2-small optimizer=mars-adamw data=openwebtext
# NPROC overrides the GPU count; RUN_DIR pins the run directory (needed to resume: add train.resume=true).
set -euo pipefail
cd "$(dirname "$0")/.."
nproc="${NPROC:-}"
if [ -z "$nproc" ]; then
    if ! command -v nvidia-smi >/dev/null; then
        echo "error: nvidia-smi is not on PATH, so the GPU count is unknown: set it, e.g." \
             "NPROC=8 scripts/launch_single_node.sh ..." >&2
        exit 1
    fi
    if ! gpus="$(nvidia-smi -L 2>&1)"; then
        echo "error: nvidia-smi -L failed (${gpus%%$'\n'*}): fix the driver, or set the GPU count, e.g." \
             "NPROC=8 scripts/launch_single_node.sh ..." >&2
        exit 1
    fi
    nproc="$(grep -c '^GPU ' <<<"$gpus" || true)"
fi
[ "$nproc" -ge 1 ] || nproc=1
run_dir="${RUN_DIR:-outputs/$(date +%Y-%m-%d/%H-%M-%S)}"
# train.py's resume line starts with this script and its process count, rather than with the torchrun it runs.
printf -v TRAIN_LAUNCH_SCRIPT '%q ' "NPROC=$nproc" "$PWD/scripts/launch_single_node.sh"
export TRAIN_LAUNCH_SCRIPT="${TRAIN_LAUNCH_SCRIPT% }"
source scripts/reason_last.sh
reason_last torchrun --standalone --nproc_per_node="$nproc" train.py "hydra.run.dir=$run_dir" "$@"
