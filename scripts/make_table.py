"""Best validation loss per optimizer x model size x token budget, beside the MARS paper's, as markdown.

    python -m scripts.make_table 'outputs/**' 'multirun/2026-11-*' [--wandb-csv val_loss.csv ...] \\
        [--out results/val_loss_table.md]

Reads the run directories that the patterns match (or that lie below a matched directory): ``metrics.jsonl``
and ``.hydra/config.yaml``. Optionally reads wandb CSV exports of a ``val/loss`` chart (columns ``Step`` and
``<run name> - val/loss``), whose run names must be preset names (``owt-gpt2-small-5b-mars-approx``: what the
presets in configs/experiment/ set as wandb.run_name). Runs that differ only in the seed are averaged; among
the settings of one optimizer (a sweep), the best is reported. The first table has the paper's layout, one per
corpus, each cell ``ours / paper (ours - paper)``; the second lists every setting.
"""
import argparse
import csv
import datetime
import logging
import re
import shlex
import statistics
import sys
from pathlib import Path

from scripts.runs import (Run, Setting, display_corpus, display_model, display_optimizer, group_settings,
                          load_runs, optimizer_order, size_order, tokens_label)

# Best validation loss on OpenWebText: Yuan et al., "MARS: Unleashing the Power of Variance Reduction for
# Training Large Models", ICML 2025, arXiv 2411.10438, as tabulated in the README of AGI-Arena/MARS.
PAPER_VAL_LOSS = {
    ("openwebtext", "small", 5e9): {"adamw": 3.193, "muon": 3.165, "mars-exact": 3.107, "mars-approx": 3.108},
    ("openwebtext", "medium", 5e9): {"adamw": 3.084, "muon": 3.009, "mars-approx": 2.969},
    ("openwebtext", "large", 5e9): {"adamw": 3.013, "muon": 2.915, "mars-approx": 2.876},
    ("openwebtext", "small", 20e9): {"adamw": 3.024, "muon": 3.006, "mars-exact": 2.980, "mars-approx": 2.981},
    ("openwebtext", "medium", 20e9): {"adamw": 2.821, "muon": 2.813, "mars-approx": 2.763},
    ("openwebtext", "large", 20e9): {"adamw": 2.741, "muon": 2.691, "mars-approx": 2.647},
    ("openwebtext", "small", 50e9): {"adamw": 2.885, "muon": 2.901, "mars-exact": 2.847, "mars-approx": 2.849},
    ("openwebtext", "medium", 50e9): {"adamw": 2.691, "muon": 2.688, "mars-approx": 2.636},
    ("openwebtext", "large", 50e9): {"adamw": 2.561, "muon": 2.573, "mars-approx": 2.518},
}
PAPER_CITATION = "Yuan et al., MARS, ICML 2025 (arXiv 2411.10438), via the AGI-Arena/MARS README"
PRESET_NAME = re.compile(r"(?P<corpus>owt|fwe)-gpt2-(?P<model>small|medium|large|xl)-(?P<billions>\d+)b-"
                         r"(?P<optimizer>adamw|muon|mars-approx|mars-exact)")
PRESET_CORPORA = {"owt": "openwebtext", "fwe": "fineweb-edu"}
MISSING = "–"

log = logging.getLogger(__name__)


def load_wandb_csv(path: Path) -> list[Run]:
    """One run per ``<run name> - val/loss`` column of a wandb chart export; the name must be a preset's."""
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f))
    if "Step" not in header:
        raise ValueError(f"{path}: not a wandb chart export (no Step column)")
    step_column = header.index("Step")
    runs = []
    for column, title in enumerate(header):
        if not title.endswith(" - val/loss"):
            continue  # the step, and the __MIN/__MAX columns of smoothed charts
        name = title.removesuffix(" - val/loss")
        parts = PRESET_NAME.fullmatch(name)
        if parts is None:
            log.warning("%s: skipping run %r, whose name is not a preset name", path, name)
            continue
        records = [{"step": int(float(row[step_column])), "val/loss": float(row[column])}
                   for row in rows if row[column].strip()]
        runs.append(Run(name=f"{path}:{name}", corpus=PRESET_CORPORA[parts["corpus"]], model=parts["model"],
                        optimizer=parts["optimizer"], budget=int(parts["billions"]) * 1e9, setting=name,
                        records=records))
    return runs


def format_difference(ours: float | None, paper: float | None) -> str:
    if ours is None and paper is None:
        return MISSING
    if paper is None:
        return f"{ours:.3f}"
    if ours is None:
        return f"{MISSING} / {paper:.3f}"
    return f"{ours:.3f} / {paper:.3f} ({ours - paper:+.3f})"


def paper_layout(groups: dict[tuple, list[Setting]]) -> list[str]:
    """Per corpus: one row per optimizer, one column per (model, budget), budgets outermost as in the paper."""
    lines = []
    for corpus in sorted({key[0] for key in groups}):
        columns = sorted({(model, budget) for c, model, budget, _ in groups if c == corpus},
                         key=lambda column: (column[1], size_order(column[0])))
        optimizers = {o for c, _, _, o in groups if c == corpus}
        optimizers |= {o for column in columns for o in PAPER_VAL_LOSS.get((corpus, *column), {})}
        headers = [f"{display_model(model)}, {tokens_label(budget)} tokens" for model, budget in columns]
        lines += [f"### {display_corpus(corpus)}: best validation loss, ours / paper (difference)", "",
                  "| optimizer | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(columns)]
        for optimizer in sorted(optimizers, key=optimizer_order):
            cells = []
            for model, budget in columns:
                settings = groups.get((corpus, model, budget, optimizer))
                ours = settings[0].mean_best_val_loss if settings and settings[0].best_val_losses else None
                cells.append(format_difference(ours, PAPER_VAL_LOSS.get((corpus, model, budget), {}).get(optimizer)))
            lines.append(f"| {display_optimizer(optimizer)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def group_order(corpus: str, model: str, budget: float, optimizer: str) -> tuple:
    return corpus, size_order(model), budget, optimizer_order(optimizer)


def settings_table(groups: dict[tuple, list[Setting]]) -> list[str]:
    lines = ["### Every setting (seeds averaged; the best setting of each optimizer is the one in the table above)",
             "", "| corpus | model | tokens | optimizer | lr | gamma | seeds | best val loss | sd | runs |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for (corpus, model, budget, optimizer), settings in sorted(groups.items(), key=lambda item: group_order(*item[0])):
        for setting in settings:
            losses, run = setting.best_val_losses, setting.first
            spread = f"{statistics.stdev(losses):.3f}" if len(losses) > 1 else MISSING
            best = f"{statistics.fmean(losses):.3f}" if losses else MISSING
            lr = f"{run.lr:g}" if run.lr is not None else MISSING
            gamma = f"{run.gamma:g}" if run.gamma is not None else MISSING
            names = ", ".join(Path(r.name).name for r in setting.runs)
            lines.append(f"| {display_corpus(corpus)} | {display_model(model)} | {tokens_label(budget)} | "
                         f"{display_optimizer(optimizer)} | {lr} | {gamma} | {len(setting.runs)} | {best} | "
                         f"{spread} | {names} |")
    return lines + [""]


def make_table(runs: list[Run]) -> str:
    groups = group_settings(runs)
    if not groups:
        raise ValueError("no runs with a logged training step: nothing to tabulate")
    return "\n".join(paper_layout(groups) + settings_table(groups) + [f"Paper numbers: {PAPER_CITATION}.", ""])


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.make_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="run directories or glob patterns (quote them)")
    parser.add_argument("--wandb-csv", type=Path, nargs="*", default=[], help="wandb chart exports of val/loss")
    parser.add_argument("--out", type=Path, default=Path("results/val_loss_table.md"), help="markdown file to write")
    args = parser.parse_args(argv)
    try:
        runs = load_runs(args.runs) + [run for path in args.wandb_csv for run in load_wandb_csv(path)]
        table = make_table(runs)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "scripts.make_table", *argv])
    args.out.write_text(f"<!-- {command} ({datetime.date.today()}) -->\n\n{table}")


if __name__ == "__main__":
    main()
