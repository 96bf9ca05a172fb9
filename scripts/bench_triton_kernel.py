"""Time the Triton MARS kernels against the HBM byte floor and torch's fused AdamW (needs a CUDA GPU).

    python -m scripts.bench_triton_kernel                                  (from the repository root)
    python -m scripts.bench_triton_kernel --model-sizes small --block-sizes 1024 2048 4096 --num-warps 4 8

For each GPT-2 parameter set, every tensor (the 1-D ones too, as with ``optimize_1d``) takes one step of each
path, with float32 parameters, gradients and state. A time is the median of CUDA-event-timed repetitions
(``triton.testing.do_bench``, which flushes L2 between them). The floor of a path is the bytes it must move
(``BYTES_PER_ELEMENT``) divided by the device-to-device copy bandwidth measured by this script on the same GPU.
Writes ``results/bench_triton_kernel_<gpu>.{md,json}``.
"""
import re
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from mars import torch_backend, triton_backend
from reporting import arguments
from reporting.bench_report import run_record, write_report
from scripts.bench_optimizer import MODEL_SIZES, gpt2_shapes, make_params

# Bytes each path moves per parameter element, float32 throughout.
BYTES_PER_ELEMENT = {
    # norm pass reads g, g_prev (8); update reads p, g, g_prev, m, v (20), writes p, m, v, g_prev (16)
    "MARS-AdamW": 8 + 20 + 16,
    # norm pass reads g, g_prev (8); update reads p, g, g_prev, m (16), writes p, m, g_prev (12)
    "MARS-Lion": 8 + 16 + 12,
    # reads p, g, m, v (16), writes p, m, v (12)
    "AdamW": 16 + 12,
}
BASELINE = "torch fused"  # the implementation every row is compared with
HYPERPARAMETERS = dict(lr=3e-4, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
GAMMA = 0.025
COPY_BYTES = 2**30


def copy_bandwidth_gb_per_s() -> float:
    """Read plus write bandwidth of a large device-to-device copy, the practical ceiling of these kernels."""
    source = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    destination = torch.empty_like(source)
    milliseconds = do_bench(lambda: destination.copy_(source), return_mode="median")
    return 2 * COPY_BYTES / milliseconds / 1e6


def time_model(model_size: str, block_sizes: list[int], num_warps: list[int]) -> list[dict]:
    """One row per path (and per Triton launch configuration): median milliseconds of one step."""
    torch.manual_seed(0)
    params = make_params(gpt2_shapes(model_size), torch.device("cuda"))
    grads = [param.grad for param in params]
    last_grads, exp_avgs, exp_avg_sqs = ([torch.randn_like(param) * 1e-3 for param in params] for _ in range(3))
    for exp_avg_sq in exp_avg_sqs:
        exp_avg_sq.square_()
    steps = [10] * len(params)

    def mars(backend, mars_type):
        return lambda: backend.mars_group_step(
            params, grads, last_grads, exp_avgs, exp_avg_sqs, None, steps=steps, gamma=GAMMA,
            mars_type=mars_type, amsgrad=False, remember_grad=True, **HYPERPARAMETERS,
        )

    def adamw(backend):
        return lambda: backend.adamw_group_step(
            params, grads, exp_avgs, exp_avg_sqs, None, steps=steps, amsgrad=False, **HYPERPARAMETERS,
        )

    rows = []
    for block_size in block_sizes:
        for warps in num_warps:
            triton_backend.BLOCK_SIZE, triton_backend.NUM_WARPS = block_size, warps
            for path, step in (("MARS-AdamW", mars(triton_backend, "mars-adamw")),
                               ("MARS-Lion", mars(triton_backend, "mars-lion")),
                               ("AdamW", adamw(triton_backend))):
                rows.append({"path": path, "implementation": f"triton, block {block_size}, {warps} warps",
                             "ms": do_bench(step, return_mode="median")})
    rows.append({"path": "MARS-AdamW", "implementation": "torch foreach backend",
                 "ms": do_bench(mars(torch_backend, "mars-adamw"), return_mode="median")})
    del last_grads, exp_avgs, exp_avg_sqs  # make room for the fused AdamW's own state
    fused_adamw = torch.optim.AdamW(
        params, lr=HYPERPARAMETERS["lr"], betas=(HYPERPARAMETERS["beta1"], HYPERPARAMETERS["beta2"]),
        eps=HYPERPARAMETERS["eps"], weight_decay=HYPERPARAMETERS["weight_decay"], fused=True,
    )
    rows.append({"path": "AdamW", "implementation": BASELINE,
                 "ms": do_bench(fused_adamw.step, return_mode="median")})
    return rows


def add_floors(rows: list[dict], num_params: int, bandwidth_gb_per_s: float) -> None:
    baseline_ms = next(row["ms"] for row in rows if row["implementation"] == BASELINE)
    for row in rows:
        row["floor_ms"] = BYTES_PER_ELEMENT[row["path"]] * num_params / bandwidth_gb_per_s / 1e6
        row["fraction_of_floor"] = row["floor_ms"] / row["ms"]
        row["vs_fused_adamw"] = row["ms"] / baseline_ms


def markdown_table(results: dict[str, dict]) -> str:
    lines = ["| model | params (M) | path | implementation | bytes/elt | ms (median) | floor ms | floor/time "
             "| vs fused AdamW |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for model_size, result in results.items():
        for row in result["rows"]:
            lines.append(f"| {model_size} | {result['num_params'] / 1e6:.1f} | {row['path']} | {row['implementation']} "
                         f"| {BYTES_PER_ELEMENT[row['path']]} | {row['ms']:.3f} | {row['floor_ms']:.3f} "
                         f"| {row['fraction_of_floor']:.0%} | {row['vs_fused_adamw']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-sizes", nargs="+", choices=list(MODEL_SIZES), default=list(MODEL_SIZES))
    parser.add_argument("--block-sizes", nargs="+", type=arguments.positive_int, default=[triton_backend.BLOCK_SIZE])
    parser.add_argument("--num-warps", nargs="+", type=arguments.positive_int, default=[triton_backend.NUM_WARPS])
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_triton_kernel times CUDA kernels and needs a CUDA GPU, but torch.cuda.is_available() is "
                 "False here (CPU-only torch build or no visible device); the kernels' CPU check is "
                 "tests/mars/test_triton_backend.py under TRITON_INTERPRET=1")
    if triton_backend.INTERPRETED:
        sys.exit("TRITON_INTERPRET=1 is set, so the kernels would run in the CPU interpreter: unset it to benchmark")

    device = torch.device("cuda")
    bandwidth = copy_bandwidth_gb_per_s()
    results = {}
    for model_size in args.model_sizes:
        num_params = sum(torch.Size(shape).numel() for shape in gpt2_shapes(model_size))
        rows = time_model(model_size, args.block_sizes, args.num_warps)
        add_floors(rows, num_params, bandwidth)
        results[model_size] = {"num_params": num_params, "rows": rows}
        torch.cuda.empty_cache()

    record = run_record("bench_triton_kernel", argv, device, triton=triton.__version__,
                        copy_bandwidth_gb_per_s=bandwidth, bytes_per_element=BYTES_PER_ELEMENT, results=results)
    write_report(args.output_dir, f"bench_triton_kernel_{re.sub(r'[^a-z0-9]+', '_', record['device'].lower())}",
                 "Triton MARS kernels vs the byte floor, one step, float32", record, markdown_table(results),
                 notes=f"Device-to-device copy: {bandwidth:.0f} GB/s.")

if __name__ == "__main__":
    main()
