"""Training throughput per optimizer: tokens/s, MFU, where a step's time goes, and peak memory.

    python -m scripts.bench_train --model gpt2-small --batch-size 16 --block-size 1024 --compile   (on a GPU)
    python -m scripts.bench_train --model tiny --batch-size 8 --block-size 128 --device cpu        (anywhere)

Each optimizer trains the same model (the configs in configs/model/ and configs/optimizer/, built as train.py
builds them) on the embedded corpus' batches for ``--warmup`` untimed then ``--steps`` timed steps of one
micro-batch, once per ``--loss-chunk-sizes`` entry (``train.loss_chunk_size``: 0 is the plain head and loss,
N > 0 the chunked linear cross-entropy of model/loss.py, N tokens at a time; ``--optimizers AdamW
--loss-chunk-sizes 0 4096`` times the two losses side by side). Steps are timed phase by phase, each phase closed
by a device synchronisation: data (the loader's batch on the device), forward, backward, look-ahead (exact
MARS's second gradient, when configured), clip (the gradient norm), optimizer. Syncing between phases costs a
little overlap on a GPU; the total is also timed without the inner syncs (``step ms``), and tokens/s and MFU
come from that. Writes a markdown table and JSON to ``results/bench_train_<device>.{md,json}``; compare rows of
one run (ratios), not runs of different days.
"""
import argparse
import functools
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import OmegaConf

from configs.compose import CONFIG_DIR, compose_config
from configs.registry import OPTIMIZERS as REGISTRY
from configs.schema import COMPILE_MODES, Precision
from data.loader import build_batches
from model import build_model, model_config as model_config_of
from reporting import arguments
from reporting.bench_report import run_record, write_report
from training.optimizers import build_optimizer
from training.runtime import autocast_context, peak_flops, resolve_dtype

CUDA_GRAPH = "optimizer.ns_cuda_graph=true"  # Newton-Schulz replayed as one CUDA graph per step: CUDA only
NS_BATCH = "optimizer.ns_batch=true"  # same-shaped matrices orthogonalised as one batch
# Rows beside each optimizer config's own: the paths worth timing against it.
VARIANTS = {
    "mars-adamw": [["optimizer.is_approx=false"]],
    "muon": [["optimizer.ns_form=fused_gram"], [CUDA_GRAPH],  # mars/newton_schulz.py NS_FORMS
             ["optimizer.ns_form=fused_gram", CUDA_GRAPH], [NS_BATCH], [NS_BATCH, CUDA_GRAPH],
             ["optimizer.ns_form=fused_gram", NS_BATCH, CUDA_GRAPH]],
    "mars-shampoo": [[CUDA_GRAPH], [NS_BATCH], [NS_BATCH, CUDA_GRAPH]],
    "mars-m": [[CUDA_GRAPH], [NS_BATCH], [NS_BATCH, CUDA_GRAPH]],
    "moonlight": [[NS_BATCH]],
}


def row_name(optimizer_cfg) -> str:
    """The registry's label of the configured optimizer (as the tables print it), and the options it times."""
    entry = REGISTRY[optimizer_cfg.name]
    options = [" fused_gram"] if optimizer_cfg.get("ns_form") == "fused_gram" else []
    options += [" ns_batch"] if optimizer_cfg.get("ns_batch") else []
    options += [" CUDA graph"] if optimizer_cfg.get("ns_cuda_graph") else []
    label = entry.label(optimizer_cfg)
    return entry.labels.get(label, label) + "".join(options)  # optimizer=external: its class name


@functools.cache
def benched_configs() -> dict[str, list[str]]:
    """Label -> overrides of configs/: every optimizer config (configs/optimizer/), then its variants. Composed
    when asked for, not at import, and once per config file (a Hydra composition takes a few tenths of a second):
    a variant's ``optimizer.*`` options are merged into its config's section."""
    rows = {}
    for path in sorted(CONFIG_DIR.glob("optimizer/*.yaml")):
        optimizer_cfg = compose_config([f"optimizer={path.stem}"]).optimizer
        for options in [[], *VARIANTS.get(path.stem, [])]:
            variant = OmegaConf.from_dotlist([option.removeprefix("optimizer.") for option in options])
            rows[row_name(OmegaConf.merge(optimizer_cfg, variant))] = [f"optimizer={path.stem}", *options]
    return rows


def cuda_only_rows() -> set[str]:
    return {label for label, overrides in benched_configs().items() if CUDA_GRAPH in overrides}


PHASES = ("data", "forward", "backward", "look-ahead", "clip", "optimizer")
BASELINE = "AdamW"


class Stopwatch:
    """Milliseconds of a phase, synchronising the device first so that its queued work counts."""

    def __init__(self, device: torch.device, sync: bool):
        self.device, self.sync = device, sync

    def __call__(self, fn: Callable[[], object]) -> tuple[object, float]:
        start = time.perf_counter()
        result = fn()
        if self.sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return result, 1000.0 * (time.perf_counter() - start)


def row_label(optimizer: str, loss_chunk_size: int, compile_mode: str = "default") -> str:
    label = optimizer if loss_chunk_size == 0 else f"{optimizer}, loss in chunks of {loss_chunk_size}"
    return label if compile_mode == "default" else f"{label}, compile mode {compile_mode}"


def orthogonalises(optimizer_label: str) -> bool:
    """Whether the row's optimizer runs Newton-Schulz (then ``--ns-dtype`` applies to it), as the registry says."""
    optimizer_cfg = compose_config(benched_configs()[optimizer_label]).optimizer
    return REGISTRY[optimizer_cfg.name].orthogonalises(optimizer_cfg)


def bench_optimizer(optimizer_label: str, loss_chunk_size: int, args, device: torch.device,
                    compile_mode: str = "default") -> dict:
    ns_dtype = [f"optimizer.ns_dtype={args.ns_dtype}"] if orthogonalises(optimizer_label) else []
    cfg = compose_config([f"model={args.model}", *benched_configs()[optimizer_label], *ns_dtype, *args.override])
    torch.manual_seed(0)
    model_config = model_config_of(OmegaConf.to_container(cfg.model))
    model = build_model(model_config).to(device)
    model.loss_chunk_size = loss_chunk_size  # as train.py sets train.loss_chunk_size
    optimizer = build_optimizer(cfg.optimizer, model)
    train_model = torch.compile(model, mode=compile_mode) if args.compile else model  # as train.compile_mode
    dtype = resolve_dtype(Precision(args.dtype), device)
    autocast = autocast_context(device, dtype)
    batches = build_batches(cfg.data, "train", batch_size=args.batch_size, block_size=args.block_size,
                            grad_accum_steps=1, seed=0, rank=0, world_size=1, device=device,
                            vocab_size=cfg.model.vocab_size)
    lookahead = getattr(optimizer, "needs_lookahead_grad", False)

    def gradient(step: int) -> None:
        x, y = batches.batch(step)
        with autocast:
            _, loss = train_model(x, y)
        loss.backward()

    def step(step_index: int, timer: Stopwatch) -> dict[str, float]:
        times = dict.fromkeys(PHASES, 0.0)
        if lookahead:
            _, times["look-ahead"] = timer(lambda: (gradient(step_index + 1), optimizer.stash_lookahead_grad(),
                                                    optimizer.zero_grad(set_to_none=True)))
        (x, y), times["data"] = timer(lambda: batches.batch(step_index))

        def forward():
            with autocast:
                return train_model(x, y)[1]
        loss, times["forward"] = timer(forward)
        _, times["backward"] = timer(loss.backward)
        _, times["clip"] = timer(lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        _, times["optimizer"] = timer(lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))
        return times

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(args.warmup):
        step(i, Stopwatch(device, sync=True))
    phases = {phase: [] for phase in PHASES}
    totals = []
    for i in range(args.warmup, args.warmup + args.steps):
        # Alternate: phase-by-phase steps (synchronised) and whole steps (not), so both see the same drift.
        for phase, ms in step(i, Stopwatch(device, sync=True)).items():
            phases[phase].append(ms)
        _, total = Stopwatch(device, sync=True)(lambda i=i: step(i + args.steps, Stopwatch(device, sync=False)))
        totals.append(total)
    step_ms = statistics.median(totals)
    tokens_per_s = args.batch_size * args.block_size / (step_ms / 1000)
    flops = peak_flops(device)
    return {
        "label": row_label(optimizer_label, loss_chunk_size, compile_mode), "optimizer": optimizer_label,
        "loss_chunk_size": loss_chunk_size, "compile_mode": compile_mode, "step_ms": step_ms,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * model_config.flops_per_token(args.block_size) / flops if flops else None,
        "phase_ms": {phase: statistics.median(ms) for phase, ms in phases.items()},
        "peak_memory_gib": (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024) / 2**30,
    }


def markdown_table(rows: list[dict], device: torch.device) -> str:
    baseline = next((row for row in rows if row["label"] == BASELINE), rows[0])
    memory = "peak GPU memory GiB" if device.type == "cuda" else "process peak RSS GiB (cumulative)"
    lines = [f"| optimizer | step ms | vs {baseline['label']} | tokens/s | MFU | "
             + " | ".join(f"{phase} ms" for phase in PHASES) + f" | {memory} |",
             "|---|" + "---:|" * (5 + len(PHASES))]
    for row in rows:
        mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "n/a"
        phases = " | ".join(f"{row['phase_ms'][phase]:.1f}" for phase in PHASES)
        lines.append(f"| {row['label']} | {row['step_ms']:.1f} | {row['step_ms'] / baseline['step_ms']:.3f}x | "
                     f"{row['tokens_per_s']:,.0f} | {mfu} | {phases} | {row['peak_memory_gib']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=arguments.device, default="auto", help="auto (cuda where there is one), cpu, "
                        "cuda, cuda:N")
    parser.add_argument("--model", default="tiny", help="a config in configs/model/ (tiny, gpt2-small, ...)")
    parser.add_argument("--optimizers", nargs="+", choices=sorted(benched_configs()),
                        help="default: every one the device runs (the CUDA graph rows on CUDA only)")
    parser.add_argument("--batch-size", type=arguments.positive_int, default=8)
    parser.add_argument("--block-size", type=arguments.positive_int, default=128)
    parser.add_argument("--dtype", choices=[p.value for p in Precision], default="auto")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model, as train.compile=true")
    parser.add_argument("--compile-modes", nargs="+", choices=COMPILE_MODES, default=["default"], metavar="MODE",
                        help="with --compile, a row per optimizer and torch.compile mode (train.compile_mode): "
                             f"{', '.join(COMPILE_MODES)}")
    parser.add_argument("--steps", type=arguments.positive_int, default=10,
                        help="timed steps per row (median reported)")
    parser.add_argument("--warmup", type=arguments.non_negative_int, default=3,
                        help="untimed steps first (compilation, state)")
    parser.add_argument("--loss-chunk-sizes", nargs="+", type=arguments.non_negative_int, default=[0], metavar="N",
                        help="a row per optimizer and size: 0 the plain loss, N > 0 the chunked loss of N tokens "
                             "a chunk (train.loss_chunk_size)")
    parser.add_argument("--ns-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="Newton-Schulz dtype of the rows that orthogonalise (Muon, MARS-Shampoo, MARS-M, "
                             "Moonlight; float32: ~10x faster on CPUs without bfloat16 units)")
    parser.add_argument("--override", nargs="*", default=[], help="config overrides for every optimizer's run")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    parser.add_argument("--tag", help="name the files bench_train_<device>_<tag>.{md,json}, so that runs of "
                                      "different rows do not overwrite each other")
    args = parser.parse_args(argv)
    if args.compile_modes != ["default"] and not args.compile:
        parser.error("--compile-modes are torch.compile's modes: add --compile")
    device = args.device
    cuda_only = cuda_only_rows()
    if args.optimizers is None:
        args.optimizers = [label for label in benched_configs() if device.type == "cuda" or label not in cuda_only]
    elif device.type != "cuda" and cuda_only & set(args.optimizers):
        parser.error(f"{sorted(cuda_only & set(args.optimizers))} need a CUDA device")
    rows = []
    for optimizer_label in args.optimizers:
        for loss_chunk_size in args.loss_chunk_sizes:
            for compile_mode in args.compile_modes:
                rows.append(bench_optimizer(optimizer_label, loss_chunk_size, args, device, compile_mode))
                print(f"{rows[-1]['label']}: {rows[-1]['step_ms']:.1f} ms/step", file=sys.stderr)
                # After every row, so that a run stopped at a time limit keeps the rows it finished.
                write_rows(rows, args, argv, device)


def write_rows(rows: list[dict], args, argv, device: torch.device) -> None:
    table = markdown_table(rows, device)
    record = run_record("bench_train", argv, device, model=args.model, batch_size=args.batch_size,
                        block_size=args.block_size, dtype=args.dtype, compile=args.compile,
                        compile_modes=args.compile_modes, loss_chunk_sizes=args.loss_chunk_sizes, steps=args.steps,
                        warmup=args.warmup, rows=rows)
    write_report(args.output_dir, f"bench_train_{device.type}" + (f"_{args.tag}" if args.tag else ""),
                 f"Training step per optimizer, {args.model}, {args.batch_size} x {args.block_size} tokens", record,
                 table)


if __name__ == "__main__":
    main()
