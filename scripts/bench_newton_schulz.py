"""Newton-Schulz (Muon, MARS-Shampoo) per step on the GPT-2 matrices: one by one, batched, and shared over ranks.

    python -m scripts.bench_newton_schulz --model-size small [--device cpu] [--ns-dtype float32] [--reps 5]

Orthogonalises the 2-D parameters of GPT-2 (the 50304-row token embedding included: the authors' Muon takes
every 2-D tensor) three ways: a loop of one matrix at a time; same-shaped matrices batched
(``mars.newton_schulz.orthogonalise``, what Muon does in one process); and, for W = 2, 4, 8 ranks, each rank's share as
``mars.newton_schulz.assign_owners`` deals them out, timed one rank after another on this one device; the slowest
rank's time is what a DDP step waits for. The all-reduce that hands the results round (4 bytes per element of
all matrices, like a float32 gradient all-reduce) is not timed here. Writes a markdown table and JSON to
``results/bench_newton_schulz_<device>.{md,json}``.
"""
import argparse
import datetime
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch

from mars import reference
from mars.newton_schulz import assign_owners, orthogonalise
from scripts.bench_optimizer import device_name, gpt2_shapes, make_timer

WORLD_SIZES = (2, 4, 8)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def time_paths(matrices: list[torch.Tensor], dtype: torch.dtype, reps: int, timer) -> dict[str, float]:
    """Median milliseconds per path; for shared paths, the slowest rank's."""
    shares = {}
    for world_size in WORLD_SIZES:
        owners = assign_owners([m.shape for m in matrices], world_size)
        shares[world_size] = [[m for m, owner in zip(matrices, owners) if owner == rank] for rank in range(world_size)]
    paths = {
        "one at a time": lambda: [reference.newton_schulz5(m, dtype=dtype) for m in matrices],
        "batched by shape": lambda: orthogonalise(matrices, 5, dtype),
    }
    times = {name: [] for name in paths}
    rank_times = {world_size: [[] for _ in range(world_size)] for world_size in WORLD_SIZES}
    for rep in range(reps + 1):  # the first round warms up
        for name, fn in paths.items():
            ms = timer(fn)
            if rep:
                times[name].append(ms)
        for world_size, ranks in shares.items():
            for rank, share in enumerate(ranks):
                ms = timer(lambda share=share: orthogonalise(share, 5, dtype)) if share else 0.0
                if rep:
                    rank_times[world_size][rank].append(ms)
    result = {name: statistics.median(ms) for name, ms in times.items()}
    for world_size, ranks in rank_times.items():
        result[f"{world_size} ranks, slowest rank"] = max(statistics.median(ms) for ms in ranks)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model-size", choices=("small", "medium", "large", "xl"), default="small")
    parser.add_argument("--ns-dtype", choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    ns_dtype = args.ns_dtype or ("bfloat16" if device.type == "cuda" else "float32")
    torch.manual_seed(0)
    matrices = [torch.randn(shape, device=device) for shape in gpt2_shapes(args.model_size) if len(shape) == 2]
    times = time_paths(matrices, DTYPES[ns_dtype], args.reps, make_timer(device))
    baseline = times["one at a time"]
    lines = ["| path | ms per step | vs one at a time |", "|---|---:|---:|"]
    lines += [f"| {name} | {ms:.1f} | {ms / baseline:.2f}x |" for name, ms in times.items()]
    command = "python -m scripts.bench_newton_schulz " + shlex.join(argv if argv is not None else sys.argv[1:])
    record = {"command": command, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "device": device_name(device), "torch": torch.__version__, "model_size": args.model_size,
              "ns_dtype": ns_dtype, "matrices": len(matrices), "reps": args.reps, "median_ms": times}
    header = (f"# Newton-Schulz (5 steps, {ns_dtype}) on the {len(matrices)} matrices of GPT-2 {args.model_size}\n\n"
              f"{record['device']}, torch {torch.__version__}, {record['date']}\n\n`{command}`\n\n")
    print(header + "\n".join(lines))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    stem = args.output_dir / f"bench_newton_schulz_{device.type}"
    stem.with_suffix(".md").write_text(header + "\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
