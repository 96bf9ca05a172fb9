"""Time one optimizer step on the GPT-2 parameter set: MARS per backend beside torch's AdamW.

    python -m scripts.bench_optimizer --device cpu --reps 7 --model-size small      (from the repository root)
    python -m scripts.bench_optimizer --triton-host-overhead --reps 200             (MARS.step vs its kernels)
    python -m scripts.bench_optimizer --host-time --reps 200                         (every optimizer's host work)
    python -m scripts.bench_optimizer --compiled --device cpu --model-size small    (eager beside compiled steps)

Every optimizer steps the same parameters and the same (random, never zero) gradients. Steps are interleaved
across optimizers so that drifts in machine load hit them all alike, and each gets warm-up steps first (state
allocation). Reports the median and the minimum (the least disturbed step on a shared machine) per optimizer,
with ratios to ``torch.optim.AdamW(foreach=True)``, as a markdown table, and writes it with the run's metadata
to ``results/bench_optimizer_<device>.{md,json}``.

``--triton-host-overhead`` times instead what ``MARS.step()`` with the Triton backend adds to its kernels
(GPT-2's 2-D tensors take the MARS kernels, the others AdamW's): the kernels alone are the launches one step
makes, recorded and replayed without the optimizer's gathering and checking. On CUDA both are timed with CUDA
events from an idle GPU, so host work before the first launch shows. On the CPU the kernels are replaced by
no-ops (``TRITON_INTERPRET=1`` imports the backend), so the table is the host's work alone. Also timed: steps
with new gradient tensors (as ``zero_grad()`` and a backward pass leave them), and steps whose backend has
forgotten its checked calls (the input checks and launch groups redone every step, as before they were cached).
Writes ``results/bench_optimizer_overhead_<device>.{md,json}``.

``--compiled`` times each optimizer's eager step beside its step compiled by ``torch.compile(optimizer.step)``
(inductor, default mode), torch's foreach AdamW among them: a timed step of a compiled one includes whatever
dynamo recompiles at that step (nothing after the third, so none with ``--warmup 3``). Writes ``results/bench_optimizer_compiled_<device>.{md,json}``.

``--host-time`` times every optimizer of the package (and torch's foreach AdamW) on the CPU over GPT-2's parameter
list with every dimension shrunk (to 8, 16, ...): as many tensors, shapes and shape groups, and next to no arithmetic, so
the step's time is its host work (the Python of gathering and dispatching, torch's dispatch and a launch per
kernel), which on a GPU runs ahead of, or holds up, the kernels: the CPU time of the step's thread, which a
shared machine's other work does not add to. MARS with Triton is timed with no-op kernels.
Writes ``results/bench_optimizer_host_time_cpu.{md,json}``.
"""
import contextlib
import importlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import torch

from configs.models import GPT2_SHAPES
from mars import MARS, MarsM, MarsMEfficient, Moonlight, Muon, available_backends
from mars.optimizer import triton_is_installed
from reporting import arguments
from reporting.bench_report import run_record, write_report

# (layers, width) of the GPT-2 family; vocabulary padded to 50304 and 1024 positions, no biases (nanoGPT).
MODEL_SIZES = {size: (n_layer, n_embd) for size, (n_layer, _, n_embd) in GPT2_SHAPES.items()}
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


COMPILED = ", compiled step"


def compiled_candidates(params: list[torch.nn.Parameter], backend: str = "inductor") -> dict[str, Callable[[], None]]:
    """Each optimizer's eager step and its step compiled by ``torch.compile`` (with ``backend``), by table label;
    all share ``params``. torch's foreach AdamW is the baseline, as in the other tables."""
    optimizers = {
        "MARS-AdamW (torch)": lambda: MARS(params, lr=3e-3, weight_decay=0.1, backend="torch"),
        "MARS-Lion (torch)": lambda: MARS(params, lr=3e-4, mars_type="mars-lion", backend="torch"),
        "Muon": lambda: Muon(params, ns_dtype=torch.float32),
        BASELINE: lambda: torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, foreach=True),
    }
    steps = {}
    for label, build in optimizers.items():
        steps[label] = step_of(build())
        steps[label + COMPILED] = torch.compile(step_of(build()), backend=backend)
    return steps


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


def step_of(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """One step as a trainer takes it; the exact MARS scheme stashes its look-ahead gradient first."""
    if getattr(optimizer, "needs_lookahead_grad", False):
        return lambda: (optimizer.stash_lookahead_grad(), optimizer.step())
    return optimizer.step


def run(device: torch.device, model_size: str, reps: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds of each timed step, per optimizer label, interleaved across optimizers."""
    torch.manual_seed(0)
    optimizers = candidates(make_params(gpt2_shapes(model_size), device), device)
    return interleaved_times(optimizers, make_timer(device), reps, warmup)


def interleaved_times(optimizers: dict[str, torch.optim.Optimizer | Callable[[], None]],
                      timer: Callable[[Callable[[], None]], float], reps: int, warmup: int) -> dict[str, list[float]]:
    """``timer`` of each optimizer's step (or of each step function), ``reps`` rounds after ``warmup``, one step of
    each in turn: a machine's slow spell falls on every optimizer alike."""
    steps = {label: step_of(each) if isinstance(each, torch.optim.Optimizer) else each
             for label, each in optimizers.items()}
    for _ in range(warmup):
        for step in steps.values():
            timer(step)
    times = {label: [] for label in steps}
    for _ in range(reps):
        for label, step in steps.items():
            times[label].append(timer(step))
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


KERNELS = "kernels alone"
TRITON_KERNELS = ("_corrected_gradient_sum_of_squares_kernel", "_clip_divisor_kernel", "_fused_step_kernel")


class _NoLaunch:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing, leaving only the host's work to time."""

    def __getitem__(self, grid) -> Callable[..., None]:
        return lambda *args, **kwargs: None


@contextlib.contextmanager
def kernels_replaced_by_no_ops(triton_backend: ModuleType) -> Iterator[None]:
    """The backend's Triton kernels replaced by :class:`_NoLaunch` for the duration."""
    saved = {name: getattr(triton_backend, name) for name in TRITON_KERNELS}
    for name in TRITON_KERNELS:
        setattr(triton_backend, name, _NoLaunch())
    try:
        yield
    finally:
        for name, kernel in saved.items():
            setattr(triton_backend, name, kernel)


def recorded_launches(optimizer: torch.optim.Optimizer, triton_backend: ModuleType) -> Callable[[], None]:
    """The kernel launches of one ``optimizer.step()``, replayable without the step's host-side work."""
    launch, launches = triton_backend._launch, []

    def recording_launch(*args, **kwargs) -> None:
        launches.append((args, kwargs))
        launch(*args, **kwargs)

    triton_backend._launch = recording_launch
    try:
        optimizer.step()
    finally:
        triton_backend._launch = launch
    return lambda: [launch(*args, **kwargs) for args, kwargs in launches]


def triton_host_overhead(device: torch.device, model_size: str, reps: int, warmup: int) -> dict[str, list[float]]:
    """Milliseconds per call of ``MARS.step()`` (Triton backend), in variants, and of its kernels alone."""
    if device.type == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the backend, and so its kernels, is imported
    triton_backend = importlib.import_module("mars.triton_backend")
    torch.manual_seed(0)
    params = make_params(gpt2_shapes(model_size), device)
    optimizer = MARS(params, lr=3e-3, weight_decay=0.1, backend="triton")

    def new_grad_tensors() -> None:
        # New tensors at the same addresses with the same metadata, as zero_grad() and a backward pass usually
        # leave them (the caching allocator hands the same blocks back).
        for param in params:
            param.grad = param.grad.detach()

    with kernels_replaced_by_no_ops(triton_backend) if device.type == "cpu" else contextlib.nullcontext():
        for _ in range(warmup):
            optimizer.step()
        variants = {  # label: (untimed preparation, timed call)
            "MARS.step": (lambda: None, optimizer.step),
            "MARS.step, new gradient tensors": (new_grad_tensors, optimizer.step),
            "MARS.step, checks rerun every step": (triton_backend._checked_calls.clear, optimizer.step),
            KERNELS: (lambda: None, recorded_launches(optimizer, triton_backend)),
        }
        timer = make_timer(device)
        times = {label: [] for label in variants}
        for _ in range(reps):
            for label, (prepare, call) in variants.items():
                prepare()
                times[label].append(timer(call))
    return times


# GPT-2's parameter list with its k-th smallest distinct dimension shrunk to TINY_STEP * k (GPT-2 small: width 768 ->
# 8, positions 1024 -> 16, 2304 -> 24, 3072 -> 32, vocabulary 50304 -> 40): the same tensors, in the same order, equal
# shapes where GPT-2's are equal, each too small for its arithmetic to count.
TINY_STEP = 8


def tiny_gpt2_shapes(model_size: str) -> list[tuple[int, ...]]:
    """:func:`gpt2_shapes` of ``model_size`` shrunk (``TINY_STEP``): as many tensors and shape groups."""
    shapes = gpt2_shapes(model_size)
    dimensions = sorted({dimension for shape in shapes for dimension in shape})
    tiny = {dimension: TINY_STEP * (rank + 1) for rank, dimension in enumerate(dimensions)}
    return [tuple(tiny[dimension] for dimension in shape) for shape in shapes]


def host_time_candidates(params: list[torch.nn.Parameter]) -> dict[str, torch.optim.Optimizer]:
    """Every optimizer of the package, and torch's foreach AdamW, over ``params``; Newton-Schulz in float32."""
    float32 = dict(ns_dtype=torch.float32)
    optimizers = {
        "MARS-AdamW (torch)": MARS(params, backend="torch"),
        "MARS-AdamW exact (torch)": MARS(params, backend="torch", is_approx=False),
        "MARS-Lion (torch)": MARS(params, backend="torch", mars_type="mars-lion"),
        "MARS-Shampoo (torch)": MARS(params, backend="torch", mars_type="mars-shampoo", **float32),
        "MARS-Shampoo (torch), ns_batch": MARS(params, backend="torch", mars_type="mars-shampoo", ns_batch=True,
                                               **float32),
        "Muon": Muon(params, **float32),
        "Muon, ns_batch": Muon(params, ns_batch=True, **float32),
        "MARS-M": MarsM(params, **float32),
        "MARS-M exact": MarsM(params, is_approx=False, **float32),
        "MARS-M efficient": MarsMEfficient(params, **float32),
        "MARS-M, ns_batch": MarsM(params, ns_batch=True, **float32),
        "Moonlight": Moonlight(params, **float32),
        BASELINE: torch.optim.AdamW(params, lr=6e-4, weight_decay=0.1, foreach=True),
    }
    return optimizers


def host_time(model_size: str, reps: int, warmup: int) -> dict[str, list[float]]:
    """CPU milliseconds per step of every optimizer on GPT-2's parameter list shrunk to :func:`tiny_gpt2_shapes`:
    what a step costs beside its arithmetic (Python, torch's dispatch, a launch per kernel), interleaved across
    optimizers, on one thread (host work is one thread's; tiny ops split over threads only wait on each
    other). MARS with the Triton backend is timed with its kernels replaced by no-ops (``TRITON_INTERPRET=1``),
    where Triton is installed."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = torch.device("cpu")
    params = make_params(tiny_gpt2_shapes(model_size), device)
    optimizers = host_time_candidates(params)
    no_op_kernels = contextlib.nullcontext()
    if triton_is_installed():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the backend, and so its kernels, is imported
        optimizers["MARS-AdamW (triton, kernels as no-ops)"] = MARS(params, backend="triton")
        no_op_kernels = kernels_replaced_by_no_ops(importlib.import_module("mars.triton_backend"))
    def timer(fn: Callable[[], None]) -> float:
        # This thread's CPU time, not the wall clock: on a shared machine the wall clock also counts the time the
        # thread waits for a core, which says nothing of the step.
        start = time.thread_time()
        fn()
        return 1000.0 * (time.thread_time() - start)

    with no_op_kernels:
        return interleaved_times(optimizers, timer, reps, warmup)


def host_time_table(times: dict[str, list[float]]) -> str:
    """Median and minimum CPU time per step in microseconds, and the median's ratio to torch's foreach AdamW."""
    medians = {label: statistics.median(ms) for label, ms in times.items()}
    lines = [f"| optimizer | median CPU us | min CPU us | vs {BASELINE} |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {1000 * medians[label]:.0f} | {1000 * min(ms):.0f} | "
              f"{medians[label] / medians[BASELINE]:.2f}x |" for label, ms in times.items()]
    return "\n".join(lines)


def ratios_to(times: dict[str, list[float]], baseline: str) -> dict[str, float]:
    """Each label's median over the baseline's."""
    medians = {label: statistics.median(ms) for label, ms in times.items()}
    return {label: ms / medians[baseline] for label, ms in medians.items()}


def overhead_table(times: dict[str, list[float]], device: torch.device) -> str:
    """Median and minimum per call; on CUDA also their ratios to the kernels alone (on the CPU those are no-ops)."""
    medians = {label: statistics.median(ms) for label, ms in times.items()}
    minimums = {label: min(ms) for label, ms in times.items()}
    if device.type == "cpu":
        lines = ["| call | median us | min us |", "|---|---:|---:|"]
        lines += [f"| {label} | {1000 * medians[label]:.1f} | {1000 * minimums[label]:.1f} |" for label in times]
        return "\n".join(lines)
    lines = [f"| call | median ms | vs {KERNELS} | min ms | vs {KERNELS}, min |", "|---|---:|---:|---:|---:|"]
    for label in times:
        lines.append(f"| {label} | {medians[label]:.3f} | {medians[label] / medians[KERNELS]:.2f}x "
                     f"| {minimums[label]:.3f} | {minimums[label] / minimums[KERNELS]:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", type=arguments.device,
                        help="default: cuda where there is one, else cpu (--host-time: cpu)")
    parser.add_argument("--reps", type=arguments.positive_int, default=7,
                        help="timed steps per optimizer (median reported)")
    parser.add_argument("--warmup", type=arguments.non_negative_int, default=2,
                        help="untimed steps per optimizer first")
    parser.add_argument("--model-size", choices=sorted(MODEL_SIZES), default="small")
    parser.add_argument("--triton-host-overhead", action="store_true",
                        help="time MARS.step (Triton backend) against its kernels alone instead (see above)")
    parser.add_argument("--host-time", action="store_true",
                        help="time every optimizer's step on the CPU on GPT-2's parameter list shrunk: its host "
                             "work (see above)")
    parser.add_argument("--compiled", action="store_true",
                        help="time each optimizer's eager step beside its torch.compile'd step instead (see above)")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    if args.host_time + args.triton_host_overhead + args.compiled > 1:
        parser.error("--host-time, --triton-host-overhead and --compiled are three benches: give one")

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.host_time else "cpu"))
    num_params = sum(torch.Size(shape).numel() for shape in gpt2_shapes(args.model_size))
    if args.host_time:
        if device.type != "cpu":
            parser.error("--host-time runs on the CPU: drop --device or give --device cpu")
        times = host_time(args.model_size, args.reps, args.warmup)
        stem, table = "bench_optimizer_host_time_cpu", host_time_table(times)
        title = (f"One optimizer step's host time, GPT-2 {args.model_size}'s parameter list shrunk (dimensions "
                 f"{TINY_STEP}, {2 * TINY_STEP}, ...), one thread")
        versions = {"triton": importlib.import_module("triton").__version__} if triton_is_installed() else {}
        ratios = {"ratio_vs_adamw_foreach": ratios_to(times, BASELINE)}
        num_params = sum(torch.Size(shape).numel() for shape in tiny_gpt2_shapes(args.model_size))
        title += f", {len(tiny_gpt2_shapes(args.model_size))} tensors"
    elif args.triton_host_overhead:
        times = triton_host_overhead(device, args.model_size, args.reps, args.warmup)
        stem, table = f"bench_optimizer_overhead_{device.type}", overhead_table(times, device)
        title = f"MARS.step (Triton backend) beside its kernels alone, GPT-2 {args.model_size}"
        versions = {"triton": importlib.import_module("triton").__version__}
        if device.type == "cpu":
            title += ", kernels replaced by no-ops: the host's work alone"
            ratios = {}  # to no-op kernels: meaningless
        else:
            ratios = {"ratio_vs_kernels_alone": ratios_to(times, KERNELS)}
    elif args.compiled:
        # Each optimizer adds its graphs to the cache of the one code object of torch.optim's step wrapper: with 4
        # optimizers, dynamo's default limit of 8 graphs a code object would leave the later ones stepping eagerly.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 32)
        torch.manual_seed(0)
        steps = compiled_candidates(make_params(gpt2_shapes(args.model_size), device))
        times = interleaved_times(steps, make_timer(device), args.reps, args.warmup)
        stem, table = f"bench_optimizer_compiled_{device.type}", markdown_table(times)
        title = f"One optimizer step, eager and compiled (torch.compile of the step, inductor), GPT-2 {args.model_size}"
        versions = {}
        ratios = {"ratio_vs_adamw_foreach": ratios_to(times, BASELINE)}
    else:
        times = run(device, args.model_size, args.reps, args.warmup)
        stem, table = f"bench_optimizer_{device.type}", markdown_table(times)
        title = f"One optimizer step, GPT-2 {args.model_size}"
        versions = {}
        ratios = {"ratio_vs_adamw_foreach": ratios_to(times, BASELINE)}
    record = run_record("bench_optimizer", None, device, **versions, model_size=args.model_size,
                        num_params=num_params, reps=args.reps, warmup=args.warmup,
                        median_ms={label: statistics.median(ms) for label, ms in times.items()}, **ratios,
                        min_ms={label: min(ms) for label, ms in times.items()}, all_ms=times)
    if not args.host_time:
        title += f" ({num_params / 1e6:.1f}M params)"
    write_report(args.output_dir, stem, title, record, table)

if __name__ == "__main__":
    main()
