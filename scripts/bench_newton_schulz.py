"""Newton-Schulz (Muon, MARS-Shampoo, MARS-M) per step on the GPT-2 matrices, every way it can run, against its floor.

    python -m scripts.bench_newton_schulz --model-size small [--device cpu] [--ns-dtype float32] [--reps 5]
                                          [--compile] [--paths "products, one at a time" ...]

Orthogonalises the 2-D parameters of GPT-2 (the 50304-row token embedding included: the authors' Muon takes
every 2-D tensor), from float32 inputs as the optimizers hand them over, along these paths, all in one run:

* each product order of ``mars.newton_schulz.NS_FORMS`` (products: the MARS authors' Muon and MARS-Shampoo;
  gram: the MARS-M authors'; fused_gram: the gram form inside addmm), one matrix at a time or batched by shape
  (``orthogonalise(..., form, batch)``, what the optimizers run);
* with ``--compile``, one matrix at a time under ``torch.compile`` (the MARS authors compile theirs);
* on CUDA, each of those captured once in a CUDA graph and replayed (``orthogonalise(..., graph=)``, what the
  optimizers' ``ns_cuda_graph=True`` runs: no launch cost, what the GPU alone needs);
* for W = 2, 4, 8 ranks, each rank's share as ``mars.newton_schulz.assign_owners`` deals them out, in the
  optimizers' default form, timed one rank after another on this one device; the slowest rank's time is what a
  DDP step waits for (the all-reduce that hands the results round is not timed).

With ``--profile``, one call of each path runs again under ``torch.profiler``: where its time goes (on CUDA, how
much of the wall time the GPU was busy and how many kernels it ran), in ``profile_newton_schulz_<device>.md``.

The floor of each path is its matrix-product flops (``newton_schulz_flops``) at the rate one large square
product reaches in ``ns_dtype`` on the same device in the same run. Writes a markdown table and JSON to
``results/bench_newton_schulz_<device>.{md,json}``.
"""
import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity

from mars.cuda_graph import CapturedLists
from mars.newton_schulz import NS_FORMS, assign_owners, newton_schulz5, newton_schulz_flops, orthogonalise
from reporting import arguments
from reporting.bench_report import run_record, write_report
from scripts.bench_optimizer import gpt2_shapes, make_timer

WORLD_SIZES = (2, 4, 8)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DEFAULT_FORM = "products"  # what Muon and MARS-Shampoo run unless told otherwise
BASELINE = f"{DEFAULT_FORM}, one at a time"


def eager_paths(dtype: torch.dtype) -> dict[str, tuple[str, Callable]]:
    """Label -> (form, function of the matrices) for every form, one at a time and batched by shape.

    Each normalises in ``dtype``, as Muon and MARS-M do (the gram form has no other).
    """
    paths = {}
    for form in NS_FORMS:
        for batch, how in ((False, "one at a time"), (True, "batched by shape")):
            paths[f"{form}, {how}"] = (form, functools.partial(orthogonalise, steps=5, dtype=dtype, form=form,
                                                               batch=batch, norm_in_dtype=True))
    return paths


def compiled_paths(dtype: torch.dtype) -> dict[str, tuple[str, Callable]]:
    """One matrix at a time through a ``torch.compile``d Newton-Schulz, per form (one graph per shape)."""
    # Every form and shape is a recompilation of the same function: room for all of them, none dropped to eager.
    torch._dynamo.config.recompile_limit = 8 * len(NS_FORMS)
    paths = {}
    for form in NS_FORMS:
        compiled = torch.compile(functools.partial(newton_schulz5, steps=5, eps=1e-7, dtype=dtype,
                                                   norm_in_dtype=True, form=form), dynamic=False)
        paths[f"{form}, one at a time, torch.compile"] = (form, lambda matrices, f=compiled: [f(m) for m in matrices])
    return paths


def matmul_tflops(dtype: torch.dtype, device: torch.device, timer, reps: int) -> float:
    """TFLOP/s of one large square product in ``dtype``: the rate the floor assumes."""
    size = 8192 if device.type == "cuda" else 1024
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    ms = statistics.median(timer(lambda: a @ b) for _ in range(reps + 1))
    return 2 * size**3 / ms / 1e9


def build_paths(matrices: list[torch.Tensor], dtype: torch.dtype, *, compile: bool = False,
                only: list[str] | None = None) -> dict[str, tuple[str, Callable]]:
    """Label -> (form, function of the matrices) of every path this run times (``only``: those labels)."""
    paths = eager_paths(dtype)
    if compile:
        paths |= compiled_paths(dtype)
    if matrices[0].device.type == "cuda":
        for form in NS_FORMS:
            for label in (f"{form}, one at a time", f"{form}, batched by shape"):
                paths[f"{label}, CUDA graph"] = (form, functools.partial(paths[label][1], graph=CapturedLists()))
    if only:
        unknown = sorted(set(only) - set(paths))
        if unknown:
            raise SystemExit(f"--paths: unknown {unknown}; choose from {sorted(paths)}")
        paths = {label: paths[label] for label in only}
    return paths


def time_paths(matrices: list[torch.Tensor], dtype: torch.dtype, reps: int, timer, *, compile: bool = False,
               only: list[str] | None = None,
               paths: dict[str, tuple[str, Callable]] | None = None) -> dict[str, dict[str, float]]:
    """Label -> {"ms": median milliseconds, "tflop": its matrix-product work}; shared paths by their slowest rank.

    ``paths`` as :func:`build_paths` makes them (by default from ``compile`` and ``only``)."""
    paths = paths if paths is not None else build_paths(matrices, dtype, compile=compile, only=only)
    shares = {}
    for world_size in WORLD_SIZES:
        owners = assign_owners([m.shape for m in matrices], world_size)
        shares[world_size] = [[m for m, owner in zip(matrices, owners) if owner == rank] for rank in range(world_size)]
    default = functools.partial(orthogonalise, steps=5, dtype=dtype, form=DEFAULT_FORM, norm_in_dtype=True)
    times = {label: [] for label in paths}
    rank_times = {world_size: [[] for _ in range(world_size)] for world_size in WORLD_SIZES}
    for rep in range(reps + 1):  # the first round warms up (and compiles)
        for label, (_, fn) in paths.items():
            ms = timer(lambda fn=fn: fn(matrices))
            if rep:
                times[label].append(ms)
        for world_size, ranks in shares.items():
            for rank, share in enumerate(ranks):
                ms = timer(lambda share=share: default(share)) if share else 0.0
                if rep:
                    rank_times[world_size][rank].append(ms)

    def work(form: str, share: list[torch.Tensor]) -> float:
        return sum(newton_schulz_flops(m.shape, form) for m in share) / 1e12

    result = {label: {"ms": statistics.median(times[label]), "tflop": work(form, matrices)}
              for label, (form, _) in paths.items()}
    for world_size, ranks in rank_times.items():
        slowest = max(range(world_size), key=lambda rank: statistics.median(ranks[rank]))
        result[f"{world_size} ranks, slowest rank ({DEFAULT_FORM}, one at a time)"] = {
            "ms": statistics.median(ranks[slowest]), "tflop": work(DEFAULT_FORM, shares[world_size][slowest])}
    return result


def profile_paths(paths: dict[str, tuple[str, Callable]], matrices: list[torch.Tensor]) -> str:
    """Markdown: where one call of each path spends its time, by ``torch.profiler``: the call's wall time (with the
    profiler's own overhead), on CUDA how long the GPU was busy and how many kernels it ran, and the operators
    that took most of it. A GPU busy for a small part of the wall time waits on launches from the host."""
    device = matrices[0].device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sections = []
    for label, (_, fn) in paths.items():
        fn(matrices)  # compiled, captured and warm before the profile
        synchronize(device)
        with torch.profiler.profile(activities=activities) as profile:
            start = time.perf_counter()
            fn(matrices)
            synchronize(device)
            wall_ms = 1000.0 * (time.perf_counter() - start)
        summary = f"{wall_ms:.1f} ms wall time under the profiler"
        if cuda:
            kernels = [event for event in profile.events() if event.device_type == DeviceType.CUDA]
            busy_ms = sum(event.device_time_total for event in kernels) / 1000.0
            summary += (f"; the GPU busy {busy_ms:.1f} ms of it ({busy_ms / wall_ms:.0%}), running {len(kernels)} "
                        "kernels and copies")
        table = profile.key_averages().table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                             row_limit=12)
        sections.append(f"## {label}\n\n{summary}\n\n```\n{table}\n```")
    return "\n\n".join(sections)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=arguments.device, default="auto", help="auto (cuda where there is one), cpu, "
                        "cuda, cuda:N")
    parser.add_argument("--model-size", choices=("small", "medium", "large", "xl"), default="small")
    parser.add_argument("--ns-dtype", choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--reps", type=arguments.positive_int, default=5)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd Newton-Schulz")
    parser.add_argument("--paths", nargs="+", metavar="LABEL", help="time only these paths (labels as in the table)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one call of each path (torch.profiler): profile_newton_schulz_<device>.md")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    device = args.device
    ns_dtype = args.ns_dtype or ("bfloat16" if device.type == "cuda" else "float32")
    dtype = DTYPES[ns_dtype]
    torch.manual_seed(0)
    matrices = [torch.randn(shape, device=device) for shape in gpt2_shapes(args.model_size) if len(shape) == 2]
    timer = make_timer(device)
    tflops = matmul_tflops(dtype, device, timer, args.reps)
    paths = build_paths(matrices, dtype, compile=args.compile, only=args.paths)
    times = time_paths(matrices, dtype, args.reps, timer, paths=paths)
    baseline = times[BASELINE]["ms"] if BASELINE in times else None
    lines = [f"| path | ms per step | TFLOP | floor ms | vs floor | vs {BASELINE} |", "|---|---:|---:|---:|---:|---:|"]
    for label, row in times.items():
        floor_ms = row["tflop"] / tflops * 1e3
        versus = f"{row['ms'] / baseline:.2f}x" if baseline else "-"
        lines.append(f"| {label} | {row['ms']:.1f} | {row['tflop']:.2f} | {floor_ms:.1f} | "
                     f"{row['ms'] / floor_ms:.1f}x | {versus} |")
    record = run_record("bench_newton_schulz", argv, device, model_size=args.model_size, ns_dtype=ns_dtype,
                        matrices=len(matrices), reps=args.reps, matmul_tflops=tflops, paths=times)
    title = f"Newton-Schulz (5 steps, {ns_dtype}) on the {len(matrices)} matrices of GPT-2 {args.model_size}"
    write_report(args.output_dir, f"bench_newton_schulz_{device.type}", title, record, "\n".join(lines),
                 notes=f"Floor: the path's matrix-product flops at {tflops:.1f} TFLOP/s, what one "
                 f"{'8192' if device.type == 'cuda' else '1024'}-square {ns_dtype} product reached in this run.")
    if args.profile:
        write_report(args.output_dir, f"profile_newton_schulz_{device.type}", f"Where the time goes: {title}",
                     record, profile_paths(paths, matrices))


if __name__ == "__main__":
    main()
