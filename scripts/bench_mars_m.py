"""MARS-M, Moonlight and Muon per step on GPT-2's parameters: the per-tensor path against the foreach path.

    python -m scripts.bench_mars_m --model-size small [--device cpu] [--ns-dtype float32] [--reps 5] [--step-reps 2]

Times, for MARS-M (approximate, exact, memory-efficient), Moonlight and Muon, each with ``foreach=False`` (the
reference's rules tensor by tensor) and ``foreach=True`` (:mod:`mars.mars_m_foreach`, :mod:`mars.muon_foreach`),
two things:

* the elementwise part: everything ``step()`` does but Newton-Schulz, which is replaced by handing back the
  directions as the updates (the exact scheme's look-ahead stash included, as a trainer calls it);
* the whole step, Newton-Schulz in ``--ns-dtype`` included.

Parameters are grouped as the trainer groups them for these optimizers (``configs.registry.matrix_rule_groups``):
the matrices of the blocks take the matrix rule, the token and position embeddings and the 1-D tensors AdamW;
Muon, as its authors ran it, orthogonalises every matrix (the embeddings too) and gives the 1-D tensors AdamW.
The two paths of an optimizer step the same parameters, interleaved, after ``--warmup`` untimed steps each.
Writes a markdown table and JSON to ``results/bench_mars_m_<device>.{md,json}``.
"""
import argparse
import statistics
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path
from unittest import mock

import torch

from mars import MarsM, MarsMEfficient, Moonlight, Muon, mars_m, muon
from reporting import arguments
from reporting.bench_report import run_record, write_report
from scripts.bench_optimizer import gpt2_shapes, make_params, make_timer, step_of

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
OPTIMIZERS = {  # label: optimizer of GPT-2's parameters (in gpt2_shapes order), grouped as the trainer groups them
    "MARS-M approx": lambda params, **options: MarsM(gpt2_groups(params), lr=6e-3, weight_decay=1e-2, **options),
    "MARS-M exact": lambda params, **options: MarsM(gpt2_groups(params), lr=6e-3, weight_decay=1e-2,
                                                    is_approx=False, **options),
    "MARS-M efficient": lambda params, **options: MarsMEfficient(gpt2_groups(params), lr=6e-3, weight_decay=1e-2,
                                                                 **options),
    "Moonlight": lambda params, **options: Moonlight(gpt2_groups(params), lr=6e-3, weight_decay=0.1, **options),
    "Muon": lambda params, **options: Muon(params, lr=2e-2, **options),
}
PATHS = {"per-tensor": False, "foreach": True}
PARTS = ("elementwise", "whole step")


def gpt2_groups(params: list[torch.nn.Parameter]) -> list[dict]:
    """The trainer's grouping of GPT-2's parameters (in ``gpt2_shapes`` order, the two embeddings first)."""
    matrices = [param for param in params[2:] if param.dim() == 2]
    others = params[:2] + [param for param in params[2:] if param.dim() != 2]
    return [{"params": matrices}, {"params": others, "matrix_rule": False}]


def newton_schulz_left_out() -> AbstractContextManager:
    """A context in which the optimizers' Newton-Schulz hands back the directions as the updates: their steps are
    the elementwise part alone."""
    stack = ExitStack()
    for module in (mars_m, muon):
        stack.enter_context(mock.patch.object(module, "orthogonalise", lambda directions, *args, **kwargs: directions))
    return stack


def time_paths(label: str, params: list[torch.nn.Parameter], ns_dtype: torch.dtype, reps: dict[str, int],
               warmup: int, timer) -> dict[str, dict[str, list[float]]]:
    """Milliseconds of each timed step of optimizer ``label``, per part (``reps[part]`` steps) and path, the paths
    interleaved."""
    steps = {path: step_of(OPTIMIZERS[label](params, ns_dtype=ns_dtype, foreach=foreach))
             for path, foreach in PATHS.items()}
    times = {}
    for part, part_reps in reps.items():
        times[part] = {path: [] for path in PATHS}
        with newton_schulz_left_out() if part == "elementwise" else nullcontext():
            for rep in range(warmup + part_reps):
                for path, step in steps.items():
                    ms = timer(step)
                    if rep >= warmup:
                        times[part][path].append(ms)
    return times


def markdown_table(times: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    """Median milliseconds per optimizer, part and path, and the per-tensor path's time over the foreach one's;
    the same ratio of the minimums, the least disturbed steps on a shared machine."""
    lines = ["| optimizer | part | per-tensor ms | foreach ms | per-tensor / foreach | same, min ms |",
             "|---|---|---:|---:|---:|---:|"]
    for label, parts in times.items():
        for part, paths in parts.items():
            per_tensor, foreach = statistics.median(paths["per-tensor"]), statistics.median(paths["foreach"])
            least = min(paths["per-tensor"]) / min(paths["foreach"])
            lines.append(f"| {label} | {part} | {per_tensor:.2f} | {foreach:.2f} | {per_tensor / foreach:.2f}x "
                         f"| {least:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=arguments.device, default="auto", help="auto (cuda where there is one), cpu, "
                        "cuda, cuda:N")
    parser.add_argument("--model-size", choices=("small", "medium", "large", "xl"), default="small")
    parser.add_argument("--ns-dtype", choices=sorted(DTYPES), help="default: bfloat16 on CUDA, float32 on CPU")
    parser.add_argument("--optimizers", nargs="+", choices=list(OPTIMIZERS), default=list(OPTIMIZERS))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="'whole step' includes Newton-Schulz: ~15 s a step for GPT-2 small on 2 CPU cores")
    parser.add_argument("--reps", type=arguments.positive_int, default=5,
                        help="timed steps per optimizer, path and part (median)")
    parser.add_argument("--step-reps", type=arguments.positive_int, help="timed whole steps instead (default: --reps)")
    parser.add_argument("--warmup", type=arguments.non_negative_int, default=1,
                        help="untimed steps first, per optimizer, path and part")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    step_reps = args.reps if args.step_reps is None else args.step_reps
    device = args.device
    ns_dtype = args.ns_dtype or ("bfloat16" if device.type == "cuda" else "float32")
    reps = {part: step_reps if part == "whole step" else args.reps for part in PARTS if part in args.parts}
    torch.manual_seed(0)
    shapes = gpt2_shapes(args.model_size)
    params = make_params(shapes, device)
    timer = make_timer(device)
    times = {label: time_paths(label, params, DTYPES[ns_dtype], reps, args.warmup, timer)
             for label in args.optimizers}
    num_params = sum(torch.Size(shape).numel() for shape in shapes)
    median_ms = {label: {part: {path: statistics.median(ms) for path, ms in paths.items()}
                         for part, paths in label_times.items()} for label, label_times in times.items()}
    record = run_record("bench_mars_m", argv, device, model_size=args.model_size, num_params=num_params,
                        ns_dtype=ns_dtype, reps=reps, warmup=args.warmup, median_ms=median_ms, all_ms=times)
    title = (f"MARS-M, Moonlight and Muon, one step on GPT-2 {args.model_size} ({num_params / 1e6:.1f}M params), "
             f"per-tensor and foreach paths" + (f" (Newton-Schulz in {ns_dtype})" if "whole step" in reps else ""))
    write_report(args.output_dir, f"bench_mars_m_{device.type}", title, record, markdown_table(times))


if __name__ == "__main__":
    main()
