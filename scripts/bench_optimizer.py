"""Time one optimizer step on the GPT-2 parameter set: MARS per backend beside torch's AdamW.

    python -m scripts.bench_optimizer --device cpu --reps 7 --model-size small      (from the repository root)

Every optimizer steps the same parameters and the same (random, never zero) gradients. Steps are interleaved
across optimizers so that drifts in machine load hit them all alike, and each gets warm-up steps first (state
allocation). Reports the median and the minimum (the least disturbed step on a shared machine) per optimizer,
with ratios to ``torch.optim.AdamW(foreach=True)``, as a markdown table, and writes it with the run's metadata
to ``results/bench_optimizer_<device>.{md,json}``.
"""
import argparse
import datetime
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mars import MARS, available_backends

# (layers, width) of the GPT-2 family; vocabulary padded to 50304 and 1024 positions, no biases (nanoGPT).
MODEL_SIZES = {"small": (12, 768), "medium": (24, 1024), "large": (36, 1280), "xl": (48, 1600)}
VOCAB_SIZE, BLOCK_SIZE = 50304, 1024
BASELINE = "AdamW (foreach)"


def gpt2_shapes(model_size: str) -> list[tuple[int, ...]]:
    """Parameter shapes of GPT-2 in nanoGPT's order (the output head is tied to the token embedding)."""
    layers, width = MODEL_SIZES[model_size]
    block = [(width,), (3 * width, width), (width, width), (width,), (4 * width, width), (width, 4 * width)]
    return [(VOCAB_SIZE, width), (BLOCK_SIZE, width)] + block * layers + [(width,)]


def make_params(shapes: list[tuple[int, ...]], device: torch.device) -> list[torch.nn.Parameter]:
    """Parameters at GPT-2's init scale, each with a random gradient of a typical post-clip size."""
    params = []
    for shape in shapes:
        param = torch.nn.Parameter(torch.randn(shape, device=device) * 0.02)
        param.grad = torch.randn(shape, device=device) * 1e-3
        params.append(param)
    return params


def candidates(params: list[torch.nn.Parameter], device: torch.device) -> dict[str, torch.optim.Optimizer]:
    """The optimizers to time, by table label; all share ``params`` (and so their gradients)."""
    optimizers = {}
    for backend in available_backends(device):
        optimizers[f"MARS-AdamW ({backend})"] = MARS(params, lr=3e-3, weight_decay=0.1, backend=backend)
    optimizers["MARS-AdamW exact (torch)"] = MARS(params, lr=3e-3, weight_decay=0.1, is_approx=False,
                                                  backend="torch")
    optimizers["MARS-Lion (torch)"] = MARS(params, lr=3e-4, mars_type="mars-lion", backend="torch")
    optimizers[BASELINE] = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, foreach=True)
    optimizers["AdamW (fused)"] = torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, fused=True)
    return optimizers


def make_timer(device: torch.device) -> Callable[[Callable[[], None]], float]:
    """A function that runs a callable once and returns its duration in milliseconds."""
    if device.type == "cuda":
        def cuda_time(fn: Callable[[], None]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(device)
            return start.elapsed_time(end)
        return cuda_time

    def wall_time(fn: Callable[[], None]) -> float:
        start = time.perf_counter()
        fn()
        return 1000.0 * (time.perf_counter() - start)
    return wall_time


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    with open("/proc/cpuinfo") as cpuinfo:
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "")
    return f"{model or platform.processor()} ({torch.get_num_threads()} threads)"


def step_of(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """One step as a trainer takes it; the exact MARS scheme stashes its look-ahead gradient first."""
    if getattr(optimizer, "needs_lookahead_grad", False):
        return lambda: (optimizer.stash_lookahead_grad(), optimizer.step())
    return optimizer.step


def run(device: torch.device, model_size: str, reps: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds of each timed step, per optimizer label, interleaved across optimizers."""
    torch.manual_seed(0)
    optimizers = candidates(make_params(gpt2_shapes(model_size), device), device)
    timer = make_timer(device)
    for _ in range(warmup):
        for optimizer in optimizers.values():
            timer(step_of(optimizer))
    times = {label: [] for label in optimizers}
    for _ in range(reps):
        for label, optimizer in optimizers.items():
            times[label].append(timer(step_of(optimizer)))
    return times


def markdown_table(times: dict[str, list[float]]) -> str:
    """Median and minimum per optimizer; on a shared machine the minimum is the least disturbed step."""
    medians = {label: statistics.median(ms) for label, ms in times.items()}
    minimums = {label: min(ms) for label, ms in times.items()}
    lines = ["| optimizer | median ms | vs AdamW (foreach) | min ms | vs AdamW (foreach), min |",
             "|---|---:|---:|---:|---:|"]
    for label in times:
        lines.append(f"| {label} | {medians[label]:.1f} | {medians[label] / medians[BASELINE]:.2f}x "
                     f"| {minimums[label]:.1f} | {minimums[label] / minimums[BASELINE]:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--reps", type=int, default=7, help="timed steps per optimizer (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per optimizer first")
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args()
    if args.reps < 1:
        parser.error("--reps must be >= 1")

    device = torch.device(args.device)
    times = run(device, args.model_size, args.reps, args.warmup)
    medians = {label: statistics.median(ms) for label, ms in times.items()}
    table = markdown_table(times)
    command = "python -m scripts.bench_optimizer " + shlex.join(sys.argv[1:])
    record = {
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(device),
        "torch": torch.__version__,
        "model_size": args.model_size,
        "num_params": sum(torch.Size(shape).numel() for shape in gpt2_shapes(args.model_size)),
        "reps": args.reps,
        "warmup": args.warmup,
        "median_ms": medians,
        "ratio_vs_adamw_foreach": {label: ms / medians[BASELINE] for label, ms in medians.items()},
        "min_ms": {label: min(ms) for label, ms in times.items()},
        "all_ms": times,
    }
    header = (f"# One optimizer step, GPT-2 {args.model_size} ({record['num_params'] / 1e6:.1f}M params)\n\n"
              f"{record['device']}, torch {record['torch']}, {record['date']}\n\n`{command}`\n\n")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / f"bench_optimizer_{device.type}"
    stem.with_suffix(".md").write_text(header + table + "\n")
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    print(table)


if __name__ == "__main__":
    main()
