#!/usr/bin/env bash
# Train on every GPU of this machine: scripts/launch_single_node.sh [Hydra overrides...]
#   scripts/launch_single_node.sh model=gpt2-small optimizer=mars-adamw data=openwebtext
# NPROC overrides the GPU count; RUN_DIR pins the run directory (needed to resume: add train.resume=true).
set -euo pipefail
cd "$(dirname "$0")/.."
nproc="${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}"
[ "$nproc" -ge 1 ] || nproc=1
run_dir="${RUN_DIR:-outputs/$(date +%Y-%m-%d/%H-%M-%S)}"
source scripts/reason_last.sh
reason_last torchrun --standalone --nproc_per_node="$nproc" train.py "hydra.run.dir=$run_dir" "$@"
