"""The MARS authors' trainer files beside our train.py, timed step for step on one GPU: the comparison a user makes.

    python -m scripts.bench_authors_trainers --authors-dir /path/to/AGI-Arena-MARS-checkout
        [--only adamw mars muon] [--steps 60] [--work-dir DIR] [--output-dir results]

Per family, their trainer file (``MARS/train_adamw.py``, ``train_mars.py``, ``train_muon.py``) runs unchanged, with
its GPT-2 small config file, under ``torchrun`` with one process (their DDP path, as each rank of their 8-GPU runs:
15 sequences of 1024 tokens x 4 micro-batches a step, bfloat16, ``torch.compile``), through
``scripts/authors_trainer_runner.py`` with no patch (its stand-in ``wandb`` keeps their ``wandb_log = True`` offline).
Their command line overrides only the length of the run, the evaluation (``--max_iters``, ``--eval_interval``
beyond the run: one evaluation, at iteration 0, of ``--eval_iters=1`` batch) and where the data is
(``--dataset``). Then train.py runs the matching
preset (``experiment=owt-gpt2-small-50b-<family>``), also under ``torchrun`` with one process, with the same step
(``train.batch_size=15``, ``train.global_batch_size=60``: 4 micro-batches), on the same data: the embedded corpus,
written as their ``train.bin``/``val.bin`` and as our shards (``scripts.check_trainer_against_authors``).

Step times: theirs are the ``time ...ms`` their trainer prints every ``log_interval`` (10, their config's)
iterations, each the time of that one iteration (``MARS/train_mars.py:407-416``: the logging's own work, after the
clock, falls into unprinted iterations); ours are train.py's ``step_ms`` of every step (``train.log_interval=1``),
the step's own time. Both skip the first ``--skip`` iterations (compilation). Writes the median of each side and
their ratio (ours / theirs) to ``<output-dir>/bench_authors_trainers_<device>.{md,json}``.
"""
import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from reporting import arguments
from reporting.bench_report import run_record, write_report
from scripts.check_trainer_against_authors import (REPO_ROOT, RUNNER, Corpus, authors_trainers_parser, free_port,
                                                   write_corpora)
from training.metrics import read_metrics
from training.provenance import checkout_commit

# Their GPT-2 small step (config/train_gpt2_small_*.py): 15 sequences x 4 micro-batches of 1024 tokens a process.
BATCH_SIZE, MICRO_BATCHES, BLOCK_SIZE = 15, 4, 1024


@dataclass(frozen=True)
class Family:
    """Their trainer and config file (relative to their checkout), and our preset of the same run."""
    name: str
    trainer: str
    config: str
    experiment: str


FAMILIES = (
    Family("adamw", "MARS/train_adamw.py", "config/train_gpt2_small_adamw.py", "owt-gpt2-small-50b-adamw"),
    Family("mars", "MARS/train_mars.py", "config/train_gpt2_small_mars.py", "owt-gpt2-small-50b-mars-approx"),
    Family("muon", "MARS/train_muon.py", "config/train_gpt2_small_muon.py", "owt-gpt2-small-50b-muon"),
)
FAMILY_NAMES = tuple(family.name for family in FAMILIES)
# What their trainer prints every log_interval iterations (MARS/train_mars.py:416).
THEIR_STEP_LINE = re.compile(r"^iter (\d+): loss [^,]*, time ([0-9.]+)ms")


def torchrun(*arguments: str) -> list[str]:
    """``torchrun`` with one process on this machine, from this interpreter."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
            f"--master_port={free_port()}", *arguments]


def their_command(family: Family, authors_dir: Path, steps: int, dataset: str, run_dir: Path) -> list[str]:
    """Their trainer under torchrun, unpatched, with their config file; only the run's length, its evaluation and
    its data set (``data/<dataset>`` of the working directory) overridden, its checkpoints into ``run_dir``."""
    overrides = {"max_iters": steps, "eval_interval": steps + 1, "eval_iters": 1, "dataset": dataset,
                 "out_dir": str(run_dir / "out")}
    return torchrun(str(RUNNER), "--patches", str(run_dir / "patches.json"), "--record", str(run_dir / "wandb.jsonl"),
                    str(authors_dir / family.trainer), str(authors_dir / family.config),
                    *(f"--{key}={value}" for key, value in overrides.items()))


def our_command(family: Family, steps: int, data_dir: Path, run_dir: Path) -> list[str]:
    """train.py with the family's preset under torchrun, their step's sizes, one evaluation (at the end)."""
    return torchrun(str(REPO_ROOT / "train.py"), f"experiment={family.experiment}", f"data.dir={data_dir}",
                    f"train.batch_size={BATCH_SIZE}", f"train.global_batch_size={BATCH_SIZE * MICRO_BATCHES}",
                    f"train.block_size={BLOCK_SIZE}", f"train.max_iters={steps}", f"train.eval_interval={steps}",
                    "train.eval_iters=1", "train.log_interval=1", f"train.checkpoint_interval={steps}",
                    "train.compile=true", "train.dtype=bfloat16", "train.device=cuda", "wandb.mode=disabled",
                    f"hydra.run.dir={run_dir}")


def their_step_ms(output: str, skip: int) -> list[float]:
    """The step times their trainer printed, of iterations ``skip`` and later."""
    times = []
    for line in output.splitlines():
        match = THEIR_STEP_LINE.match(line.strip())
        if match and int(match.group(1)) >= skip:
            times.append(float(match.group(2)))
    return times


def our_step_ms(records: list[dict], skip: int) -> list[float]:
    """train.py's step times of its steps after ``skip`` updates (its step k follows k - 1 updates, as their
    iteration k - 1 does)."""
    return [record["step_ms"] for record in records if "step_ms" in record and record["step"] > skip]


def run_logged(side: str, command: list[str], cwd: Path, log_path: Path) -> str:
    """Run ``command``, its output into ``log_path``; its output, or SystemExit naming ``side`` and the log if it
    fails."""
    result = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log_path.write_text(result.stdout)
    if result.returncode != 0:
        raise SystemExit(f"{side} exited with {result.returncode}: see {log_path}")
    return result.stdout


def time_family(family: Family, authors_dir: Path, steps: int, skip: int, work_dir: Path, corpus: Corpus) -> dict:
    """Both sides' step times of ``family``, theirs first."""
    theirs_dir, ours_dir = work_dir / "runs" / f"{family.name}-theirs", work_dir / "runs" / f"{family.name}-ours"
    theirs_dir.mkdir(parents=True)
    (theirs_dir / "patches.json").write_text("[]")  # unchanged: no patch
    output = run_logged(f"their {family.trainer}", their_command(family, authors_dir, steps, corpus.their_dataset,
                                                                   theirs_dir), work_dir, theirs_dir / "output.log")
    run_logged(f"train.py with {family.experiment}", our_command(family, steps, corpus.our_dir, ours_dir), REPO_ROOT,
               work_dir / f"{family.name}-ours.log")
    theirs, ours = their_step_ms(output, skip), our_step_ms(read_metrics(ours_dir), skip)
    if not theirs or not ours:
        raise SystemExit(f"{family.name}: no step time after iteration {skip} on "
                         f"{'their' if not theirs else 'our'} side: give more --steps")
    return {"theirs_ms": theirs, "ours_ms": ours, "theirs_median_ms": statistics.median(theirs),
            "ours_median_ms": statistics.median(ours),
            "ratio": statistics.median(ours) / statistics.median(theirs)}


def markdown_table(timings: dict[str, dict]) -> str:
    lines = ["| family | their trainer | our preset | theirs, median ms | ours, median ms | ours / theirs |",
             "|---|---|---|---:|---:|---:|"]
    for family in FAMILIES:
        if family.name in timings:
            timing = timings[family.name]
            lines.append(f"| {family.name} | `{family.trainer}` | `{family.experiment}` "
                         f"| {timing['theirs_median_ms']:.1f} ({len(timing['theirs_ms'])} steps) "
                         f"| {timing['ours_median_ms']:.1f} ({len(timing['ours_ms'])} steps) "
                         f"| {timing['ratio']:.2f}x |")
    return "\n".join(lines)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = authors_trainers_parser("scripts.bench_authors_trainers", __doc__, FAMILY_NAMES)
    parser.add_argument("--skip", type=arguments.non_negative_int, default=10,
                        help="first iterations left out of the medians (compiling)")
    args = parser.parse_args(argv)
    if args.steps <= args.skip:
        parser.error(f"argument --steps: must exceed --skip ({args.skip}), not {args.steps}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_authors_trainers times the trainers on a GPU, and this machine has none")
    authors_dir = args.authors_dir.resolve()
    families = [family for family in FAMILIES if args.only is None or family.name in args.only]
    for family in families:
        for relative in (family.trainer, family.config):
            if not (authors_dir / relative).is_file():
                raise SystemExit(f"--authors-dir {authors_dir} does not look like a checkout of AGI-Arena/MARS: "
                                 f"{relative} is missing")
    with tempfile.TemporaryDirectory(prefix="bench-authors-trainers-") as scratch:
        work_dir = (args.work_dir or Path(scratch)).resolve()
        corpus = write_corpora(work_dir)["owt"]
        timings = {family.name: time_family(family, authors_dir, args.steps, args.skip, work_dir, corpus)
                   for family in families}
    device = torch.device("cuda")
    record = run_record("bench_authors_trainers", argv, device, authors_dir=str(authors_dir),
                        authors_commit=checkout_commit(authors_dir), steps=args.steps, skip=args.skip,
                        timings=timings)
    notes = (f"Each side: GPT-2 small, {BATCH_SIZE} x {BLOCK_SIZE} tokens x {MICRO_BATCHES} micro-batches a step, "
             f"bfloat16, torch.compile, torchrun with one process, the embedded corpus; {args.steps} steps, the "
             f"medians of the steps from iteration {args.skip} on (theirs: every 10th, as their trainer prints "
             f"it). Their code: `{authors_dir}` ({record['authors_commit'] or 'commit unknown'}), unchanged.")
    write_report(args.output_dir, f"bench_authors_trainers_{device.type}",
                 "The MARS authors' trainers beside train.py, step time", record, markdown_table(timings), notes)


if __name__ == "__main__":
    main()
