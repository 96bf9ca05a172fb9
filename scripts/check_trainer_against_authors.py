"""The MARS authors' trainer files and our train.py side by side on one small corpus, loss for loss, on the CPU.

    python -m scripts.check_trainer_against_authors --authors-dir /path/to/AGI-Arena-MARS-checkout
        [--only FAMILY ...] [--steps 60] [--eval-interval 20] [--eval-iters 4] [--work-dir DIR]
        [--output-dir results] [--authors-commit SHA]

The embedded corpus (Shakespeare) is written once as their ``train.bin``/``val.bin`` (raw uint16 tokens) and as
our shards, and once more as FineWeb-Edu-style shards (``fineweb_train_*.bin``, ``fineweb_val_000000.bin``: llm.c's
layout, which their FineWeb-Edu trainers and our loader both read). Per optimizer family, their trainer file runs
unchanged but for the patches listed in the output (``scripts/authors_trainer_runner.py``), with their GPT-2 small
config file and their own ``--key=value`` overrides for a tiny model; then train.py runs the matching preset with
the same sizes, schedule and seed. Both in float32 on one CPU thread, with torch.compile disabled
(``TORCH_COMPILE_DISABLE=1``: their ``@torch.compile``'d Newton-Schulz functions run eagerly, as ours). A patch
that no longer applies to their files stops the check before anything runs, naming it.

Their trainer runs as rank 0 of a one-process DDP group (gloo), as each rank of their 8-GPU runs: one micro-batch a
step (outside DDP their trainer multiplies the accumulation by 8, ``MARS/train_mars.py:122``), so the training
loss it logs, the last micro-batch's (``:412``), is the step's loss ours logs, and its gradient is the mean (our
``train.grad_multiplier=1``). Their figures are what they log to wandb, recorded by a stand-in ``wandb`` module:
the training loss of iteration k (measured after k updates; ours logs it as step k + 1), and at each evaluation
their ``estimate_loss``, train split and val split (ours: ``train/loss_estimate`` and ``val/loss``); and their
final ``best_val_loss``. Prints, per family, the largest difference of each over the run and the first step at
which any differs at all (bitwise), and writes ``<output-dir>/check_against_authors_trainer_cpu.{md,json}`` (the
JSON with every step's figures).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from data.embedded import prepare_embedded
from data.shards import read_shard, write_shard
from reporting import arguments
from reporting.bench_report import run_record, write_report
from scripts.authors_trainer_runner import PatchError, check_patches
from training.metrics import read_metrics
from training.provenance import checkout_commit

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNNER = REPO_ROOT / "scripts" / "authors_trainer_runner.py"
TINY_MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32}
BATCH_SIZE = 8  # sequences per step, one micro-batch: 256 tokens a step
WARMUP_ITERS = 10
FINEWEB_TRAIN_SHARDS = 2  # their FineWeb-Edu trainers pick one shard per batch: give them two to pick from


# ------------------------------------------------------------------------------------------------- the families
@dataclass(frozen=True)
class Family:
    """One optimizer family: their trainer and config file (relative to their checkout), our preset, and the
    overrides each side takes beyond the shared sizes."""
    name: str
    trainer: str
    config: str
    experiment: str
    their_overrides: tuple[str, ...] = ()
    our_overrides: tuple[str, ...] = ()
    corpus: str = "owt"  # owt: their train.bin/val.bin; fineweb: their FineWeb-Edu shards

    @property
    def needs(self) -> tuple[str, ...]:
        """The files of their checkout this family runs or patches."""
        return (self.trainer, self.config) + tuple(patch.file for patch in patches_for(self))


# Their Newton-Schulz is always bfloat16; ours on the CPU would be float32 (ns_dtype=auto).
NS_BFLOAT16 = "optimizer.ns_dtype=bfloat16"
MARS_CONFIG, MARS_M_CONFIG = "config/train_gpt2_small_mars.py", "MARS_M/config/train_gpt2_small_mars_m.py"
FAMILIES = (
    Family("adamw", "MARS/train_adamw.py", "config/train_gpt2_small_adamw.py", "owt-gpt2-small-50b-adamw"),
    Family("mars-adamw-approx", "MARS/train_mars.py", MARS_CONFIG, "owt-gpt2-small-50b-mars-approx"),
    Family("mars-adamw-exact", "MARS/train_mars.py", MARS_CONFIG, "owt-gpt2-small-50b-mars-exact",
           ("--is_approx=False",)),
    Family("mars-lion", "MARS/train_mars.py", MARS_CONFIG, "owt-gpt2-small-50b-mars-approx",
           ("--mars_type=mars-lion",), ("optimizer.mars_type=mars-lion",)),
    Family("mars-shampoo", "MARS/train_mars.py", MARS_CONFIG, "owt-gpt2-small-50b-mars-approx",
           ("--mars_type=mars-shampoo",), ("optimizer.mars_type=mars-shampoo", NS_BFLOAT16)),
    Family("muon", "MARS/train_muon.py", "config/train_gpt2_small_muon.py", "owt-gpt2-small-50b-muon",
           our_overrides=(NS_BFLOAT16,)),
    Family("mars-m", "MARS_M/train_mars_m.py", MARS_M_CONFIG, "owt-gpt2-small-50b-mars-m",
           our_overrides=(NS_BFLOAT16,)),
    Family("moonlight", "MARS_M/train_moonlight.py", "MARS_M/config/train_gpt2_small_moonlight.py",
           "owt-gpt2-small-50b-moonlight", our_overrides=(NS_BFLOAT16,)),
    Family("adamw-fineweb", "MARS/train_adamw_fw.py", "config/train_gpt2_small_adamw.py",
           "fwe-gpt2-small-50b-adamw", corpus="fineweb"),
    Family("mars-adamw-approx-fineweb", "MARS/train_mars_fw.py", MARS_CONFIG, "fwe-gpt2-small-50b-mars-approx",
           corpus="fineweb"),
)
FAMILY_NAMES = tuple(family.name for family in FAMILIES)


# -------------------------------------------------------------------------------------- patches to their code
@dataclass(frozen=True)
class Patch:
    """In ``file`` (relative to their checkout) the text ``old`` becomes ``new``, because ``why``."""
    name: str
    file: str
    old: str
    new: str
    why: str

    def for_runner(self, authors_dir: Path) -> dict:
        return {"name": self.name, "file": str(authors_dir / self.file), "old": self.old, "new": self.new}

    def where(self, authors_dir: Path) -> str:
        """``file:line`` of the patched text in their checkout (``file`` alone where it is not there once)."""
        text = (authors_dir / self.file).read_text()
        if text.count(self.old) != 1:
            return self.file
        return f"{self.file}:{text[:text.index(self.old)].count(chr(10)) + 1}"


def patches_for(family: Family) -> list[Patch]:
    """What their trainer needs changed to run as one CPU process of a DDP group: nothing of the training."""
    patches = [
        Patch("ddp-device", family.trainer,
              "    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n", "",
              "their DDP path puts rank r on cuda:r whatever --device says; without it --device=cpu holds"),
        Patch("ddp-cpu-module", family.trainer, "DDP(model, device_ids=[ddp_local_rank])", "DDP(model)",
              "DDP takes no device_ids for a module on the CPU"),
    ]
    if family.trainer.endswith("train_muon.py"):
        patches.append(Patch("muon-buffer-device", "MARS/optimizers/muon.py", "device='cuda'",
                             "device=group['params'][0].device",
                             "their Muon makes its update buffer on CUDA whatever its parameters' device"))
    return patches


def check_authors_dir(authors_dir: Path, families: list[Family]) -> None:
    """Exit with one line unless ``authors_dir`` holds every file the chosen families run or patch, and every patch
    applies to its file (before anything runs: a stale patch is never skipped)."""
    if not authors_dir.is_dir():
        raise SystemExit(f"--authors-dir {authors_dir}: no such directory; give a checkout of AGI-Arena/MARS")
    for family in families:
        for relative in family.needs:
            if not (authors_dir / relative).is_file():
                raise SystemExit(f"--authors-dir {authors_dir} does not look like a checkout of AGI-Arena/MARS: "
                                 f"{relative} is missing")
    try:
        for family in families:  # each runs its trainer with its own patches (families share trainer files)
            check_patches([patch.for_runner(authors_dir) for patch in patches_for(family)])
    except PatchError as err:
        raise SystemExit(str(err)) from None


# ------------------------------------------------------------------------------------------------- the corpus
@dataclass(frozen=True)
class Corpus:
    """Where each side reads one corpus: their data_path/dataset, our data.dir."""
    their_dataset: str
    our_dir: Path


def write_corpora(work_dir: Path) -> dict[str, Corpus]:
    """The embedded corpus as their train.bin/val.bin and our shards (``owt``), and as FineWeb-Edu shards that both
    sides read (``fineweb``). Their data lives in ``work_dir/data``, where every trainer of theirs looks."""
    embedded = prepare_embedded()
    tokens = {split: np.asarray(read_shard(embedded / f"{split}.bin")) for split in ("train", "val")}
    theirs, ours, fineweb = work_dir / "data" / "owt", work_dir / "ours" / "owt", work_dir / "data" / "fineweb"
    for directory in (theirs, ours, fineweb):
        directory.mkdir(parents=True, exist_ok=True)
    for split, split_tokens in tokens.items():
        split_tokens.astype("<u2").tofile(theirs / f"{split}.bin")
        write_shard(ours / f"{split}.bin", split_tokens)
    for index, shard in enumerate(np.array_split(tokens["train"], FINEWEB_TRAIN_SHARDS)):
        write_shard(fineweb / f"fineweb_train_{index:06d}.bin", shard)
    write_shard(fineweb / "fineweb_val_000000.bin", tokens["val"])
    return {"owt": Corpus("owt", ours), "fineweb": Corpus("fineweb", fineweb)}


# ------------------------------------------------------------------------------------------------- the two runs
@dataclass(frozen=True)
class RunSize:
    steps: int
    eval_interval: int
    eval_iters: int


def their_arguments(family: Family, authors_dir: Path, size: RunSize, corpus: Corpus, out_dir: Path) -> list[str]:
    """Their config file, then their own ``--key=value`` overrides: the tiny model, one micro-batch of
    ``BATCH_SIZE`` a step, the short schedule, float32 on the CPU without compile, gloo for the DDP group."""
    shared = {**TINY_MODEL, "batch_size": BATCH_SIZE, "gradient_accumulation_steps": 1, "max_iters": size.steps,
              "lr_decay_iters": size.steps, "warmup_iters": WARMUP_ITERS, "eval_interval": size.eval_interval,
              "eval_iters": size.eval_iters, "log_interval": 1, "device": "cpu", "dtype": "float32",
              "compile": False, "backend": "gloo", "out_dir": str(out_dir), "dataset": corpus.their_dataset}
    return [str(authors_dir / family.config), *(f"--{key}={value}" for key, value in shared.items()),
            *family.their_overrides]


def our_overrides(family: Family, size: RunSize, corpus: Corpus, run_dir: Path) -> list[str]:
    """The preset with the sizes of ``their_arguments``; the gradient is the mean, as their one-rank step's."""
    model = [f"model.{key}={value}" for key, value in TINY_MODEL.items()]
    return [f"experiment={family.experiment}", f"data.dir={corpus.our_dir}", *model,
            f"train.block_size={TINY_MODEL['block_size']}", f"train.batch_size={BATCH_SIZE}",
            f"train.global_batch_size={BATCH_SIZE}", "train.grad_multiplier=1", f"train.max_iters={size.steps}",
            f"train.warmup_iters={WARMUP_ITERS}", f"train.eval_interval={size.eval_interval}",
            f"train.eval_iters={size.eval_iters}", "train.log_interval=1", f"train.checkpoint_interval={size.steps}",
            "train.compile=false", "train.dtype=float32", "train.device=cpu", "wandb.mode=disabled",
            f"hydra.run.dir={run_dir}", *family.our_overrides]


def run_environment(**extra: str) -> dict[str, str]:
    """This environment without any launcher's ranks, on one CPU thread (the same reductions on both sides) and
    with torch.compile disabled: their ``@torch.compile``'d Newton-Schulz functions run eagerly, as ours do."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    return {**environment, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCH_COMPILE_DISABLE": "1", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunFailed(Exception):
    """One side's run exited non-zero; the message is its last line of output."""


def run_logged(command: list[str], cwd: Path, environment: dict[str, str], log_path: Path) -> None:
    """Run ``command``, its output into ``log_path``; raise ``RunFailed`` with its last line if it fails."""
    with open(log_path, "w") as log:
        result = subprocess.run(command, cwd=cwd, env=environment, stdout=log, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        lines = [line for line in log_path.read_text().splitlines() if line.strip()]
        raise RunFailed(f"exit {result.returncode}: {lines[-1] if lines else 'no output'} (log: {log_path})")


def run_theirs(family: Family, authors_dir: Path, size: RunSize, corpus: Corpus, work_dir: Path) -> list[dict]:
    """Their trainer through the runner, as rank 0 of a one-process gloo group; what it logged."""
    run_dir = work_dir / "runs" / f"{family.name}-theirs"
    run_dir.mkdir(parents=True)
    patches_file, record = run_dir / "patches.json", run_dir / "wandb.jsonl"
    patches_file.write_text(json.dumps([patch.for_runner(authors_dir) for patch in patches_for(family)]))
    command = [sys.executable, str(RUNNER), "--patches", str(patches_file), "--record", str(record),
               str(authors_dir / family.trainer), *their_arguments(family, authors_dir, size, corpus, run_dir / "out")]
    environment = run_environment(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT=str(free_port()))
    run_logged(command, work_dir, environment, run_dir / "output.log")
    return [json.loads(line) for line in record.read_text().splitlines()]


def run_ours(family: Family, size: RunSize, corpus: Corpus, work_dir: Path) -> list[dict]:
    """train.py with the family's preset at the tiny sizes; its metrics records."""
    run_dir = work_dir / "runs" / f"{family.name}-ours"
    run_dir.mkdir(parents=True)
    command = [sys.executable, str(REPO_ROOT / "train.py"), *our_overrides(family, size, corpus, run_dir)]
    run_logged(command, REPO_ROOT, run_environment(), run_dir / "output.log")
    return read_metrics(run_dir)


# ----------------------------------------------------------------------------------------------- the figures
@dataclass
class Curves:
    """One side's figures by our step numbering (updates done when measured, but the training loss: step k is
    measured after k - 1 updates, as train.py logs it)."""
    train_loss: dict[int, float] = field(default_factory=dict)
    lr: dict[int, float] = field(default_factory=dict)
    val_loss: dict[int, float] = field(default_factory=dict)
    train_estimate: dict[int, float] = field(default_factory=dict)
    best_val_loss: float | None = None


FIGURES = ("train_loss", "lr", "val_loss", "train_estimate")


def their_curves(records: list[dict], steps: int) -> Curves:
    """Their wandb records: an evaluation at iteration k (``val/loss``, and ``train/loss`` its train-split estimate)
    is our evaluation after k steps; the training record of iteration k (``train/loss``, ``lr``) our step k + 1.
    Their last iteration (they train steps 0 to max_iters inclusive) has no step of ours."""
    curves = Curves()
    for record in records:
        if "best_val_loss" in record:
            curves.best_val_loss = record["best_val_loss"]
        elif "val/loss" in record:
            curves.val_loss[record["step"]] = record["val/loss"]
            curves.train_estimate[record["step"]] = record["train/loss"]
        elif record["step"] + 1 <= steps:
            curves.train_loss[record["step"] + 1] = record["train/loss"]
            curves.lr[record["step"] + 1] = record["lr"]
    return curves


def our_curves(records: list[dict]) -> Curves:
    """train.py's metrics records; the best val loss is the minimum of the evaluations, as its summary says."""
    curves = Curves()
    for record in records:
        for figure, key in (("train_loss", "train/loss"), ("lr", "lr"), ("val_loss", "val/loss"),
                            ("train_estimate", "train/loss_estimate")):
            if key in record:
                getattr(curves, figure)[record["step"]] = record[key]
    curves.best_val_loss = min(curves.val_loss.values(), default=None)
    return curves


def compare(ours: Curves, theirs: Curves) -> dict:
    """Per figure, every step both sides have (ours, theirs, difference) and the largest difference; the steps
    only one side has; the first step at which any figure differs at all; the best val losses' difference."""
    summary = {"figures": {}}
    first_by_figure = {}
    for figure in FIGURES:
        mine, other = getattr(ours, figure), getattr(theirs, figure)
        rows = [{"step": step, "ours": mine[step], "theirs": other[step], "diff": abs(mine[step] - other[step])}
                for step in sorted(mine.keys() & other.keys())]
        summary["figures"][figure] = {
            "rows": rows, "max_abs_diff": max((row["diff"] for row in rows), default=None),
            "only_ours": sorted(mine.keys() - other.keys()), "only_theirs": sorted(other.keys() - mine.keys())}
        first_by_figure[figure] = next((row["step"] for row in rows if row["diff"] != 0), None)
    first = min((step for step in first_by_figure.values() if step is not None), default=None)
    summary["first_differing_step"] = first
    summary["first_differing"] = [figure for figure, step in first_by_figure.items()
                                  if first is not None and step == first]
    summary["best_val_loss"] = {"ours": ours.best_val_loss, "theirs": theirs.best_val_loss,
                                "diff": (None if None in (ours.best_val_loss, theirs.best_val_loss)
                                         else abs(ours.best_val_loss - theirs.best_val_loss))}
    return summary


# ------------------------------------------------------------------------------------------------- the report
def format_difference(difference: float | None) -> str:
    if difference is None:
        return "n/a"
    return f"{difference:.1e}" if difference else "0"


def table_row(name: str, summary: dict) -> str:
    if "failed" in summary:
        return f"| {name} | failed: {summary['failed']} |||||||"
    figures = summary["figures"]
    first = summary["first_differing_step"]
    first_text = "-" if first is None else f"{first} ({', '.join(summary['first_differing'])})"
    return (f"| {name} | {len(figures['train_loss']['rows'])} | {len(figures['val_loss']['rows'])} "
            f"| {format_difference(figures['train_loss']['max_abs_diff'])} "
            f"| {format_difference(figures['val_loss']['max_abs_diff'])} "
            f"| {format_difference(figures['train_estimate']['max_abs_diff'])} "
            f"| {format_difference(summary['best_val_loss']['diff'])} | {first_text} |")


def markdown_table(summaries: dict[str, dict]) -> str:
    lines = ["| family | steps | evaluations | max \\|Δ\\| train loss | max \\|Δ\\| val loss "
             "| max \\|Δ\\| train-split estimate | \\|Δ\\| best val loss | first differing step |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    return "\n".join(lines + [table_row(name, summary) for name, summary in summaries.items()])


def one_line(text: str) -> str:
    return " / ".join(line.strip() for line in text.splitlines() if line.strip())


def patch_lines(families: list[Family], authors_dir: Path) -> str:
    """Every patch applied to their code, once each, with where it applies."""
    seen, lines = set(), []
    for family in families:
        for patch in patches_for(family):
            where = patch.where(authors_dir)
            if where not in seen:
                seen.add(where)
                lines.append(f"- `{where}` ({patch.name}): {patch.why}: `{one_line(patch.old)}` -> "
                             f"`{one_line(patch.new) or '(removed)'}`")
    return "Patches to their code (in memory, applied by `scripts/authors_trainer_runner.py`):\n\n" + "\n".join(lines)


def setup_notes(authors_dir: Path, commit: str | None, size: RunSize) -> str:
    shape = ", ".join(f"{key} {value}" for key, value in TINY_MODEL.items())
    return (f"Their code: `{authors_dir}` ({commit or 'commit unknown'}): their trainer files with their GPT-2 small "
            f"config files and `--key=value` overrides, each run as rank 0 of a one-process DDP group (gloo), its "
            f"figures what it logs to wandb (recorded by a stand-in `wandb` module) and its final `best_val_loss`. "
            f"Ours: train.py with the family's preset. Both: the embedded corpus, a GPT-2 of {shape}, {BATCH_SIZE} "
            f"sequences a step in one micro-batch, {size.steps} steps (warmup {WARMUP_ITERS}, cosine to min_lr at "
            f"the last step), evaluations every {size.eval_interval} steps of {size.eval_iters} batches per split, "
            f"seed 5000, float32 on one CPU thread, torch.compile disabled (`TORCH_COMPILE_DISABLE=1`: their "
            f"`@torch.compile`'d Newton-Schulz runs eagerly, as ours). Steps are ours: a training loss at step k is "
            f"measured after k - 1 updates (their iteration k - 1), an evaluation at step k after k updates. best "
            f"val loss: theirs as their trainer keeps it, ours the minimum of the evaluations. first differing "
            f"step: the first step at which any of the training loss, lr, val loss or train-split estimate differs "
            f"at all. Why the figures differ: docs/paper.md (the model's float32 rounding).")


def their_shard_order(corpus: Corpus) -> list[str]:
    """The training shards as their FineWeb-Edu trainers list them (``MARS/train_mars_fw.py:136``): in the order
    ``os.listdir`` gives, which the file system decides; ours are sorted by name."""
    return [name for name in os.listdir(corpus.our_dir) if name.startswith("fineweb_train") and name.endswith(".bin")]


def shard_order_note(order: list[str]) -> str:
    agreement = "sorted, as ours" if order == sorted(order) else "NOT sorted: their draws name other shards than ours"
    return f"Their FineWeb-Edu trainers list the training shards here as {', '.join(order)} ({agreement})."


# --------------------------------------------------------------------------------------------------- the check
def check_family(family: Family, authors_dir: Path, size: RunSize, corpora: dict[str, Corpus],
                 work_dir: Path) -> dict:
    """Both runs of ``family`` and their comparison; a run that fails is reported, not raised."""
    corpus = corpora[family.corpus]
    try:
        ours = our_curves(run_ours(family, size, corpus, work_dir))
        theirs = their_curves(run_theirs(family, authors_dir, size, corpus, work_dir), size.steps)
    except RunFailed as err:
        return {"failed": str(err)}
    return compare(ours, theirs)


def authors_trainers_parser(module: str, description: str,
                            family_names: tuple[str, ...]) -> arguments.OneLineParser:
    """The options of a script that runs the authors' trainers beside ours: their checkout, which families, how many
    steps, where the runs and the report go."""
    parser = arguments.OneLineParser(prog=f"python -m {module}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-dir", type=Path, required=True, help="a checkout of github.com/AGI-Arena/MARS")
    parser.add_argument("--only", nargs="+", choices=family_names, metavar="FAMILY",
                        help=f"these families only (default: all of {', '.join(family_names)})")
    parser.add_argument("--steps", type=arguments.positive_int, default=60, help="training steps of each run")
    parser.add_argument("--work-dir", type=Path, help="where the corpora and runs go (default: a temporary folder, "
                        "removed afterwards)")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = authors_trainers_parser("scripts.check_trainer_against_authors", __doc__, FAMILY_NAMES)
    parser.add_argument("--eval-interval", type=arguments.positive_int, default=20, help="steps between evaluations")
    parser.add_argument("--eval-iters", type=arguments.positive_int, default=4,
                        help="batches per split at each evaluation")
    parser.add_argument("--authors-commit", help="their commit, for a checkout that is not a git work tree")
    args = parser.parse_args(argv)
    if args.steps <= WARMUP_ITERS:
        parser.error(f"argument --steps: must exceed the warmup ({WARMUP_ITERS}), not {args.steps}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    families = [family for family in FAMILIES if args.only is None or family.name in args.only]
    authors_dir = args.authors_dir.resolve()
    check_authors_dir(authors_dir, families)
    size = RunSize(args.steps, args.eval_interval, args.eval_iters)
    with tempfile.TemporaryDirectory(prefix="check-trainer-") as scratch:
        work_dir = (args.work_dir or Path(scratch)).resolve()
        corpora = write_corpora(work_dir)
        shard_order = their_shard_order(corpora["fineweb"])
        summaries = {family.name: check_family(family, authors_dir, size, corpora, work_dir) for family in families}
    commit = checkout_commit(authors_dir) or args.authors_commit
    record = run_record("check_trainer_against_authors", argv, torch.device("cpu"), authors_dir=str(authors_dir),
                        authors_commit=commit, steps=args.steps, eval_interval=args.eval_interval,
                        eval_iters=args.eval_iters, their_shard_order=shard_order,
                        patches=[patch.__dict__ | {"where": patch.where(authors_dir)}
                                 for family in families for patch in patches_for(family)], summaries=summaries)
    notes = [setup_notes(authors_dir, commit, size), patch_lines(families, authors_dir)]
    if any(family.corpus == "fineweb" for family in families):
        notes.append(shard_order_note(shard_order))
    write_report(args.output_dir, "check_against_authors_trainer_cpu", "The MARS authors' trainers beside ours",
                 record, markdown_table(summaries), "\n\n".join(notes))
    if any("failed" in summary for summary in summaries.values()):
        raise SystemExit("some runs failed: see the table")


if __name__ == "__main__":
    main()
