"""The MARS authors' trainer files beside our train.py, loss for loss, on the CPU.

    python -m scripts.check_trainer_against_authors --authors-dir /path/to/AGI-Arena-MARS-checkout
                                                    [--only FAMILY ...] [--steps 60] [--output-dir results]

The authors' code (github.com/AGI-Arena/MARS) is run from ``--authors-dir``; this repository holds none of it.
The embedded Shakespeare corpus is written as their ``data/<dataset>/{train,val}.bin`` (raw uint16); their trainer
file runs unchanged in a subprocess (``scripts/authors_trainer_runner.py``), with their GPT-2 small config file and
their own ``--key=value`` overrides for a tiny float32 model, and our train.py runs the matching preset scaled down
by the same overrides. A change their file needs to run on the CPU is an exact-string patch applied in memory, each
listed in the output; one that no longer applies stops the check, by name.

Their losses come from their log lines, printed to 4 decimals (``iter N: loss L`` is the loss of step N's last
micro-batch, as computed: not divided by the accumulation steps; with one micro-batch per step that is the step's
loss, ours ``train/loss`` of step N + 1, our steps counting from 1), ``step N: train loss T, val loss V`` their evaluation (ours ``train/loss_estimate``
and ``val/loss``); best val loss is the running minimum of val loss on both sides. So "equal" here means within
5e-5, the rounding of their print.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from data.embedded import prepare_embedded
from data.shards import read_shard
from training.metrics import read_metrics

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "scripts" / "authors_trainer_runner.py"
DATASET = "shakespeare"
PRINT_ROUNDING = 5e-5  # their losses are printed with 4 decimals
# The tiny run both sides make: their variable names, ours after them.
TINY = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=4, eval_iters=4)


@dataclass(frozen=True)
class Patch:
    name: str
    old: str
    new: str


@dataclass(frozen=True)
class Family:
    trainer: str  # relative to their checkout
    config: str  # their GPT-2 small config file, relative to their checkout
    preset: str  # ours
    their_args: tuple[str, ...] = ()
    our_args: tuple[str, ...] = ()
    patches: tuple[Patch, ...] = field(default=())


FAMILIES = {
    "adamw": Family("MARS/train_adamw.py", "config/train_gpt2_small_adamw.py", "experiment=owt-gpt2-small-5b-adamw"),
}


def check_authors_dir(authors_dir: Path, families: list[str]) -> None:
    """Exit with one line unless ``authors_dir`` holds the trainer and config files of ``families``."""
    if not authors_dir.is_dir():
        raise SystemExit(f"--authors-dir {authors_dir}: no such directory; give a checkout of AGI-Arena/MARS")
    for name in families:
        for relative in (FAMILIES[name].trainer, FAMILIES[name].config):
            if not (authors_dir / relative).is_file():
                raise SystemExit(f"--authors-dir {authors_dir} does not look like a checkout of AGI-Arena/MARS: "
                                 f"{relative} is missing")


# ------------------------------------------------------------------------------------------------ running
def write_their_corpus(work_dir: Path) -> Path:
    """The embedded corpus as their trainers read it: ``data/<dataset>/{train,val}.bin``, raw uint16."""
    ours = prepare_embedded()
    theirs = work_dir / "data" / DATASET
    theirs.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        np.asarray(read_shard(ours / f"{split}.bin"), dtype=np.uint16).tofile(theirs / f"{split}.bin")
    return ours


def schedule(steps: int) -> dict:
    return dict(max_iters=steps, warmup_iters=max(steps // 6, 1), eval_interval=max(steps // 3, 1))


def their_command(authors_dir: Path, family: Family, steps: int, out_dir: Path) -> list[str]:
    overrides = dict(TINY, **schedule(steps), lr_decay_iters=steps, gradient_accumulation_steps=1, log_interval=1,
                     device="cpu", dtype="float32", compile=False, wandb_log=False, dataset=DATASET,
                     out_dir=str(out_dir), always_save_checkpoint=False)
    args = [str(authors_dir / family.config), *(f"--{k}={v}" for k, v in overrides.items()), *family.their_args]
    patches = json.dumps([[p.name, p.old, p.new] for p in family.patches])
    return [sys.executable, str(RUNNER), str(authors_dir / family.trainer), patches, "--", *args]


def our_command(family: Family, steps: int, data_dir: Path, run_dir: Path) -> list[str]:
    s = schedule(steps)
    overrides = [family.preset, "data=custom", f"data.dir={data_dir}", f"model.n_layer={TINY['n_layer']}",
                 f"model.n_head={TINY['n_head']}", f"model.n_embd={TINY['n_embd']}",
                 f"model.block_size={TINY['block_size']}", f"train.block_size={TINY['block_size']}",
                 f"train.batch_size={TINY['batch_size']}", f"train.global_batch_size={TINY['batch_size']}",
                 "train.grad_multiplier=1", f"train.eval_iters={TINY['eval_iters']}", f"train.max_iters={steps}",
                 f"train.warmup_iters={s['warmup_iters']}", f"train.eval_interval={s['eval_interval']}",
                 "train.log_interval=1", "train.device=cpu", "train.dtype=float32", "train.compile=false",
                 "train.tf32=false", "wandb.mode=disabled", f"hydra.run.dir={run_dir}", *family.our_args]
    return [sys.executable, str(REPO / "train.py"), *overrides]


def run(command: list[str], cwd: Path, log: Path) -> str:
    """Run ``command``; its output, or exit naming the log of the run that failed."""
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONHASHSEED="0"))
    log.write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"{command[1]} failed ({last}); its output is in {log}")
    return result.stdout


# ------------------------------------------------------------------------------------------------ comparing
ITER_LINE = re.compile(r"^iter (\d+): loss (-?[\d.]+|nan|inf)", re.M)
EVAL_LINE = re.compile(r"^step (\d+): train loss (-?[\d.]+|nan|inf), val loss (-?[\d.]+|nan|inf)", re.M)


def running_min(values: dict[int, float]) -> dict[int, float]:
    best, out = float("inf"), {}
    for step in sorted(values):
        best = min(best, values[step])
        out[step] = best
    return out


def their_losses(log: str) -> dict[str, dict[int, float]]:
    """Per step, from their trainer's output: train loss, and at evaluations val loss and the best so far."""
    evals = EVAL_LINE.findall(log)
    val = {int(s): float(v) for s, _, v in evals}
    return {"train": {int(s): float(v) for s, v in ITER_LINE.findall(log)},
            "estimate": {int(s): float(t) for s, t, _ in evals}, "val": val, "best_val": running_min(val)}


def our_losses(records: list[dict]) -> dict[str, dict[int, float]]:
    """The same figures from our metrics.jsonl records. Our steps count from 1, their iterations from 0: our step
    N's train/loss is the forward pass before the N-th update, their ``iter N - 1``; an evaluation at step N follows
    N updates on both sides."""
    def series(key, shift=0):
        return {r["step"] - shift: r[key] for r in records if key in r}
    val = series("val/loss")
    return {"train": series("train/loss", shift=1), "estimate": series("train/loss_estimate"), "val": val,
            "best_val": running_min(val)}


def compare(theirs: dict, ours: dict) -> dict:
    """Per figure, the largest |difference| over the steps both sides logged, and the first step where they differ
    by more than their print's rounding; ``missing`` names a figure one side lacks at a step the other logged."""
    row, first = {}, None
    for key in ("train", "val", "best_val", "estimate"):
        steps = sorted(set(theirs[key]) | set(ours[key]))
        lacking = [s for s in steps if s not in theirs[key] or s not in ours[key]]
        if lacking:
            row["missing"] = f"{key} at step {lacking[0]} on one side"
        diffs = {s: abs(theirs[key][s] - ours[key][s]) for s in steps if s in theirs[key] and s in ours[key]}
        row[key] = max(diffs.values(), default=float("nan"))
        differing = [s for s, d in diffs.items() if not d <= PRINT_ROUNDING]
        if differing and (first is None or min(differing) < first):
            first = min(differing)
    row["first_differing_step"] = first
    return row


def check_family(authors_dir: Path, name: str, steps: int, work_dir: Path, data_dir: Path) -> dict:
    family = FAMILIES[name]
    their_log = run(their_command(authors_dir, family, steps, work_dir / f"{name}-theirs"), work_dir,
                    work_dir / f"{name}-theirs.log")
    run_dir = work_dir / f"{name}-ours"
    run(our_command(family, steps, data_dir, run_dir), REPO, work_dir / f"{name}-ours.log")
    return compare(their_losses(their_log), our_losses(read_metrics(run_dir)))


# ------------------------------------------------------------------------------------------------ report
def table(rows: dict[str, dict]) -> str:
    lines = ["| family | max \\|diff\\| train loss | val loss | best val loss | train-split estimate | "
             "first differing step |", "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        first = row["first_differing_step"]
        lines.append(f"| {name} | {row['train']:.4g} | {row['val']:.4g} | {row['best_val']:.4g} | "
                     f"{row['estimate']:.4g} | {'none' if first is None else first} |"
                     + (f" {row['missing']}" if "missing" in row else ""))
    return "\n".join(lines)


def patch_list(names: list[str]) -> str:
    lines = [f"- {name}: {p.name}" for name in names for p in FAMILIES[name].patches]
    return "Patches applied in memory to their files:\n" + ("\n".join(lines) if lines else "- none")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--authors-dir", type=Path, required=True)
    parser.add_argument("--only", nargs="+", choices=sorted(FAMILIES), default=sorted(FAMILIES))
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    check_authors_dir(args.authors_dir, args.only)
    with tempfile.TemporaryDirectory() as tmp:
        work_dir = Path(tmp)
        data_dir = write_their_corpus(work_dir)
        rows = {name: check_family(args.authors_dir.resolve(), name, args.steps, work_dir, data_dir)
                for name in args.only}
    print(patch_list(args.only))
    print(table(rows))


if __name__ == "__main__":
    main()
