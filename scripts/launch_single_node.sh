#!/usr/bin/env bash
# Train on every GPU of this machine: scripts/launch_single_node.sh [Hydra overrides...]
#   scripts/launch_single_node.sh model=gpt2-small optimizer=mars-adamw data=openwebtext
# NPROC overrides the GPU count; RUN_DIR pins the run directory (needed to resume: add train.resume=true); TORCHRUN
# the torchrun to run (default: the one on PATH, the activated venv's).
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
torchrun="${TORCHRUN:-torchrun}"
case "$torchrun" in */*) ;; *) torchrun="$(command -v "$torchrun" || true)" ;; esac
if [ -z "$torchrun" ] || [ ! -x "$torchrun" ]; then
    echo "error: torchrun is not on PATH: activate the project's venv, or name it, e.g." \
         "TORCHRUN=.venv/bin/torchrun scripts/launch_single_node.sh ..." >&2
    exit 1
fi
torchrun="$(cd "${torchrun%/*}" && pwd)/${torchrun##*/}"  # by its path: the resume line runs it from anywhere
run_dir="${RUN_DIR:-outputs/$(date +%Y-%m-%d/%H-%M-%S)}"
# train.py's resume line starts with this script, its process count and its torchrun by path, rather than with the
# torchrun it runs: a shell without the venv activated runs it as printed.
printf -v TRAIN_LAUNCH_SCRIPT '%q ' "NPROC=$nproc" "TORCHRUN=$torchrun" "$PWD/scripts/launch_single_node.sh"
export TRAIN_LAUNCH_SCRIPT="${TRAIN_LAUNCH_SCRIPT% }"
source scripts/reason_last.sh
reason_last "$torchrun" --standalone --nproc_per_node="$nproc" train.py "hydra.run.dir=$run_dir" "$@"
