"""The small-scale version of the paper's comparison that a CPU can run: tiny GPT-2 on the embedded corpus.

    python -m scripts.small_study [--out runs/small-study] [--jobs 2] [--phases lr seeds gamma] [--only NAME ...]
                                  [--dry-run]

Every run trains the same model on the same number of tokens (``STEPS`` x 8 x 128) with the treatment of the
GPT-2 small presets (configs/paper/): the authors' model (attention scores scaled by inverse layer index, tanh
GELU), embeddings outside weight decay for every optimizer, 4x the mean gradient clipped at 1.0
(``train.grad_multiplier``), a cosine schedule from each optimizer's peak lr to one absolute ``MIN_LR`` for all,
and each optimizer's second learning rate at a fixed ratio to the swept one (MARS-AdamW: lr_1d = lr / 2, as in
every config of the authors; Muon: its AdamW part at 0.15 x lr, the authors' 3e-3 / 2e-2). Three phases, each
using the results of the one before:

1. ``lr``: a short lr sweep per optimizer (AdamW, Muon, MARS-AdamW approx and exact, MARS-Lion), seed 1337,
   extended by a factor 3 (up to ``MAX_EXTENSIONS`` times) past whichever end of the sweep holds the best lr;
2. ``seeds``: the best lr of each optimizer again with seeds 1 and 2;
3. ``gamma``: MARS-AdamW approx at its best lr with other gammas, 0 included (MARS without its correction),
   each with seed 1337 and the seeds of phase 2 (the paper's 0.025 has them from phases 1 and 2);
4. ``contenders`` (not run by default): the seeds of phase 2 also for every other lr whose seed-1337 loss lies
   within ``CONTENDER_MARGIN`` of the best, so that each optimizer's best lr can be read off three seeds.

Runs land in ``<out>/<name>/`` (a train.py run directory); a finished run is not run again, so an interrupted
study resumes where it stopped. Each run uses one thread, ``--jobs`` of them at a time. Then
``python -m scripts.make_table <out>`` and ``python -m scripts.plot_curves <out>`` turn the runs into the table
and the figures; results/README.md holds them.
"""
import argparse
import concurrent.futures
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from reporting import arguments
from reporting.run_reading import load_run
from training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[1]
STEPS = 200
SEEDS = (1, 2)  # the extra seeds of phase 2; phase 1 uses train.seed's default, 1337
GAMMAS = (0.0, 0.01, 0.05)  # phase 3, beside the paper's 0.025 of phase 1; 0: no variance reduction
MAX_EXTENSIONS = 1  # extra lrs per optimizer when the best one lies at the edge of its sweep
# Phase "contenders": an lr whose seed-1337 loss lies this close to the best one's gets the extra seeds too (the
# seed spread at the best lrs is 0.02-0.10), so that the best lr is the best mean of three seeds.
CONTENDER_MARGIN = 0.1
MIN_LR = 3e-5  # the GPT-2 small presets' absolute min_lr, for every optimizer (the authors' configs)
GRAD_MULTIPLIER = 4  # the GPT-2 small presets' gradient scale (the authors' 4 summed micro-batches)
COMMON = ("model=tiny", "data=embedded", f"train.max_iters={STEPS}", "train.warmup_iters=20",
          "train.eval_interval=50", "train.eval_iters=16", "train.log_interval=25",
          "train.checkpoint_interval=100", "train.keep_checkpoints=1", f"train.min_lr={MIN_LR:g}",
          f"train.grad_multiplier={GRAD_MULTIPLIER}")


@dataclass(frozen=True)
class Optimizer:
    name: str  # the run-name prefix
    overrides: tuple[str, ...]
    lrs: tuple[float, ...]
    # Learning rates that follow the swept one at a fixed ratio: (key, ratio) sets key = ratio x lr.
    scaled_lrs: tuple[tuple[str, float], ...] = ()
    sweeps_gamma: bool = False  # phase "gamma" runs it at its best lr with each of GAMMAS


OPTIMIZERS = (
    Optimizer("adamw", ("optimizer=adamw",), (1e-3, 3e-3, 1e-2)),
    Optimizer("mars-approx", ("optimizer=mars-adamw",), (3e-3, 1e-2, 3e-2), (("optimizer.lr_1d", 0.5),),
              sweeps_gamma=True),
    Optimizer("mars-exact", ("optimizer=mars-adamw", "optimizer.is_approx=false"), (3e-3, 1e-2, 3e-2),
              (("optimizer.lr_1d", 0.5),)),
    Optimizer("mars-lion", ("optimizer=mars-lion",), (1e-4, 3e-4, 1e-3), (("optimizer.lr_1d", 1.0),)),
    # float32 Newton-Schulz: this CPU runs bfloat16 matrix products ~10x slower (see mars.reference).
    Optimizer("muon", ("optimizer=muon", "optimizer.ns_dtype=float32"), (1e-2, 2e-2, 4e-2),
              (("optimizer.adamw_lr", 0.15),)),
)

log = logging.getLogger("small_study")


def run_name(optimizer: Optimizer, lr: float, seed: int | None = None, gamma: float | None = None) -> str:
    name = f"{optimizer.name}_lr{lr:g}"
    if gamma is not None:
        name += f"_gamma{gamma:g}"
    return name + (f"_seed{seed}" if seed is not None else "")


def overrides(optimizer: Optimizer, lr: float, seed: int | None = None, gamma: float | None = None) -> list[str]:
    args = [*COMMON, *optimizer.overrides, f"optimizer.lr={lr:g}"]
    args += [f"{key}={ratio * lr:g}" for key, ratio in optimizer.scaled_lrs]
    if gamma is not None:
        args.append(f"optimizer.gamma={gamma:g}")
    if seed is not None:
        args.append(f"train.seed={seed}")
    return args


def finished(run_dir: Path) -> bool:
    return any(r.get("step") == STEPS and "val/loss" in r for r in read_metrics(run_dir))


def train(run_dir: Path, args: list[str]) -> None:
    if finished(run_dir):
        log.info("%s: done already", run_dir.name)
        return
    # An interrupted run goes on from its last checkpoint (resumes are exact), or starts afresh without one.
    command = [sys.executable, "train.py", *args, f"hydra.run.dir={run_dir}", "train.resume=true"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    started = time.perf_counter()
    log.info("%s: %s", run_dir.name, " ".join(args))
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "stdout.log", "w") as out:
        result = subprocess.run(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise RuntimeError(f"{run_dir.name} failed (exit {result.returncode}); see {run_dir / 'stdout.log'}")
    log.info("%s: finished in %.0f s", run_dir.name, time.perf_counter() - started)


def run_all(jobs: dict[str, list[str]], out: Path, parallel: int, dry_run: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if dry_run:
        for name, args in jobs.items():
            print(f"{out / name}: python train.py {' '.join(args)}")
        return
    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
        for future in [pool.submit(train, out / name, args) for name, args in jobs.items()]:
            future.result()


def sweep_losses(optimizer: Optimizer, out: Path) -> dict[float, float]:
    """Best validation loss per lr of the optimizer's finished lr-sweep runs (seed 1337, default gamma)."""
    pattern = re.compile(rf"{re.escape(optimizer.name)}_lr([0-9.e+-]+)")
    losses = {}
    for run_dir in out.glob(f"{optimizer.name}_lr*"):
        match = pattern.fullmatch(run_dir.name)
        run = load_run(run_dir) if match and finished(run_dir) else None
        if run is not None:
            losses[float(match.group(1))] = run.best_val_loss
    missing = [lr for lr in optimizer.lrs if lr not in losses]
    if missing:
        raise RuntimeError(f"the lr sweep of {optimizer.name} has not finished lr {missing}: run it first "
                           "(--phases lr)")
    return losses


def best_lr(optimizer: Optimizer, out: Path) -> float:
    losses = sweep_losses(optimizer, out)
    return min(losses, key=losses.get)


def extension_jobs(out: Path, optimizers: tuple[Optimizer, ...] = OPTIMIZERS) -> dict[str, list[str]]:
    """One more lr, a factor 3 further out, for each optimizer whose best lr lies at the edge of its sweep."""
    jobs = {}
    for o in optimizers:
        losses = sweep_losses(o, out)
        best = min(losses, key=losses.get)
        if len(losses) - len(o.lrs) >= MAX_EXTENSIONS or min(losses) < best < max(losses):
            continue
        lr = float(f"{best / 3:.0e}") if best == min(losses) else float(f"{best * 3:.0e}")
        jobs[run_name(o, lr)] = overrides(o, lr)
    return jobs


def phase_jobs(phase: str, out: Path, optimizers: tuple[Optimizer, ...] = OPTIMIZERS) -> dict[str, list[str]]:
    if phase == "lr":
        return {run_name(o, lr): overrides(o, lr) for o in optimizers for lr in o.lrs}
    if phase == "seeds":
        jobs = {}
        for o in optimizers:
            lr = best_lr(o, out)
            jobs.update({run_name(o, lr, seed): overrides(o, lr, seed) for seed in SEEDS})
        return jobs
    if phase == "contenders":
        jobs = {}
        for o in optimizers:
            losses = sweep_losses(o, out)
            best = min(losses.values())
            for lr, loss in sorted(losses.items()):
                if loss != best and loss - best <= CONTENDER_MARGIN:
                    jobs.update({run_name(o, lr, seed): overrides(o, lr, seed) for seed in SEEDS})
        return jobs
    if phase == "gamma":
        jobs = {}
        for o in (o for o in optimizers if o.sweeps_gamma):
            lr = best_lr(o, out)
            jobs.update({run_name(o, lr, seed, g): overrides(o, lr, seed, g)
                         for g in GAMMAS for seed in (None, *SEEDS)})
        return jobs
    raise ValueError(f"unknown phase {phase!r}")


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "small-study")
    parser.add_argument("--jobs", type=arguments.positive_int, default=2, help="runs at a time, one thread each")
    parser.add_argument("--phases", nargs="+", choices=("lr", "seeds", "gamma", "contenders"),
                        default=["lr", "seeds", "gamma"])
    parser.add_argument("--only", nargs="+", choices=[o.name for o in OPTIMIZERS],
                        help="these optimizers only, in this order (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="print the train.py commands instead")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    out = args.out.resolve()
    optimizers = tuple(next(o for o in OPTIMIZERS if o.name == name) for name in args.only) if args.only else OPTIMIZERS
    for phase in args.phases:
        run_all(phase_jobs(phase, out, optimizers), out, args.jobs, args.dry_run)
        # A best lr at the edge of the sweep may not be the best: look further out, up to MAX_EXTENSIONS times.
        while phase == "lr" and not args.dry_run and (jobs := extension_jobs(out, optimizers)):
            run_all(jobs, out, args.jobs, dry_run=False)


if __name__ == "__main__":
    main()
