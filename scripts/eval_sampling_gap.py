"""How far the best of fresh-window evaluations (the paper's procedure) lies below the best on fixed windows.

    python -m scripts.eval_sampling_gap [--seeds 1 2 3 4] [--out results/eval_sampling_gap_cpu.md]
                                        [--runs /tmp/eval-sampling-gap] [--steps 200] [-- train.key=value ...]

Trains a small GPT-2 on the embedded corpus once per seed with ``train.eval_sampling=fresh``, which scores both
the fresh windows (``val/loss``) and the fixed ones (``val/loss_fixed``) at every evaluation, and reports per
seed the best of each and their gap. Both figures come from the same weights at the same steps: the gap is the
evaluation procedure's alone. It has two parts: the minimum of noisy estimates lies below their mean, and the one
fixed set of windows is easier or harder than the average window; the mean over evaluations (step 0, where both
score the same windows, excepted) of fresh minus fixed estimates the second. The windows at a step are the same
for every seed (as the authors' are for every run), so the seeds vary the model, not the windows. A finished run
is not trained again.
"""
import datetime
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from reporting import arguments
from training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
# A two-layer GPT-2 that a shared CPU trains in minutes; 11 evaluations of 8 x 8 windows of 64 tokens.
RUN = ("model=tiny", "model.n_layer=2", "model.n_embd=64", "data=embedded", "train.block_size=64",
       "train.eval_sampling=fresh", "train.eval_interval=10", "train.eval_iters=8", "train.warmup_iters=15",
       "train.log_interval=50", "train.checkpoint_interval=1000", "train.device=cpu")


def train(run_dir: Path, seed: int, steps: int, extra: list[str]) -> list[dict]:
    """The evaluations of the seed's run (trained first unless its log reaches ``steps``)."""
    records = read_metrics(run_dir)
    if not any(r.get("step") == steps and "val/loss" in r for r in records):
        subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *RUN, f"train.max_iters={steps}",
                        f"train.seed={seed}", "train.overwrite=true", *extra], cwd=REPO, check=True,
                       capture_output=True)
        records = read_metrics(run_dir)
    return [r for r in records if "val/loss_fixed" in r]


def seed_figures(evaluations: list[dict]) -> tuple[float, float, float]:
    """The best fresh-window loss, the best fixed-window loss, and the mean of fresh minus fixed over the
    evaluations after step 0."""
    later = [r["val/loss"] - r["val/loss_fixed"] for r in evaluations if r["step"] > 0]
    return (min(r["val/loss"] for r in evaluations), min(r["val/loss_fixed"] for r in evaluations),
            statistics.fmean(later))


def gap_table(figures: dict[int, tuple[float, float, float]]) -> list[str]:
    lines = ["| seed | best val loss, fresh windows | best val loss, fixed windows | best fresh - best fixed | "
             "mean fresh - fixed, same step |", "|---:|---:|---:|---:|---:|"]
    for seed, (fresh, fixed, offset) in figures.items():
        lines.append(f"| {seed} | {fresh:.4f} | {fixed:.4f} | {fresh - fixed:+.4f} | {offset:+.4f} |")
    gaps = [fresh - fixed for fresh, fixed, _ in figures.values()]
    offsets = [offset for _, _, offset in figures.values()]
    spread = (lambda values: f" (sd {statistics.stdev(values):.4f})" if len(values) > 1 else "")
    lines.append(f"| mean | | | {statistics.fmean(gaps):+.4f}{spread(gaps)} | "
                 f"{statistics.fmean(offsets):+.4f}{spread(offsets)} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = arguments.OneLineParser(prog="python -m scripts.eval_sampling_gap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=arguments.positive_int, default=100)
    parser.add_argument("--runs", type=Path, default=Path("/tmp/eval-sampling-gap"))
    parser.add_argument("--out", type=Path, default=REPO / "results" / "eval_sampling_gap_cpu.md")
    parser.add_argument("overrides", nargs="*", help="further train.py overrides (after --)")
    args = parser.parse_args(argv)
    figures = {}
    for seed in args.seeds:
        evaluations = train(args.runs / f"seed{seed}", seed, args.steps, args.overrides)
        figures[seed] = seed_figures(evaluations)
    command = shlex.join(["python", "-m", "scripts.eval_sampling_gap", *argv])
    table = gap_table(figures)
    print("\n".join(table))
    settings = " ".join([*RUN, f"train.max_iters={args.steps}", *args.overrides])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(f"<!-- {command} ({datetime.date.today()}) -->\n\nEach seed: `python train.py {settings} "
                        f"train.seed=SEED`; best of the {len(evaluations)} evaluations.\n\n" + "\n".join(table) + "\n")


if __name__ == "__main__":
    main()
