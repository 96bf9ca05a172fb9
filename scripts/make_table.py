"""Best validation loss per optimizer x model size x token budget, beside the MARS paper's, as markdown.

    python -m scripts.make_table 'outputs/**' 'multirun/2026-11-*' [--wandb-csv val_loss.csv ...] \\
        [--out table.md] [--target-loss 3.3]

Reads the run directories that the patterns match (or that lie below a matched directory): ``metrics.jsonl``
and ``.hydra/config.yaml``. Optionally reads wandb CSV exports of a ``val/loss`` chart (columns ``Step`` and
``<run name> - val/loss``), whose run names must be preset names (``owt-gpt2-small-5b-mars-approx``: what the
presets in configs/experiment/ set as wandb.run_name). Runs that differ only in the seed are averaged; among
the settings of one optimizer (a sweep), the best is reported. The first table has the paper's layout, one per
corpus, each cell ``ours / paper (ours - paper)`` (on C4, in validation perplexity beside the full-rank Adam
baseline of GaLore's Table 2, for runs of its LLaMA sizes and steps: ``LITERATURE_PERPLEXITY``); the second lists
every setting, its final val loss beside its best (the step-0 evaluation of the untrained model is never a best). A figure that includes a run
whose last logged step is short of its max_iters (preempted and never resumed, killed, still running) is marked
``*``, and the legend and the runs column say where each such run stopped. A sweep point that was refused,
diverged or failed (``failure.json``) has a row of its own marked failed, with its reason; two runs of one
setting with the same seed count once (the table says which it kept and why). With ``--target-loss X``, a third
table gives the tokens and training time each setting took to reach validation loss X (see
reporting/target_loss.py). The table is printed and written to ``--out``, by default ``val_loss_table.md`` in the
deepest directory holding every run and export (``val_loss_table_target_X.md`` with ``--target-loss X``, so that
the two forms, run in turn, keep both tables); a file that was there already is replaced with the line
``replaced <file>``, never silently.

Two kinds of figure stand at a budget B such as 5B tokens, in rows of their own: that of separate runs configured
for B (a cosine schedule that ends at B: the presets of that budget), and, in the rows "<optimizer>, within <L>
run", the best validation loss within the first B tokens of a longer run of L tokens, whose learning rate is still
high at B (``Run.best_val_loss_within``: up to the step where the preset of budget B stops). The paper's 5B and
20B columns are most likely of the second kind: the authors' configs define only 100,000-step (50B) runs.
"""
import argparse
import csv
import datetime
import logging
import math
import os
import re
import shlex
import statistics
import sys
from pathlib import Path

from omegaconf import OmegaConf

from configs.registry import OPTIMIZERS
from reporting.figures import unwritable_output
from reporting.run_labels import (display_corpus, display_model, display_optimizer, optimizer_order,
                                other_learning_rates, size_order, tokens_label)
from reporting.run_reading import Run
from reporting.run_selection import Setting, find_run_dirs, group_settings, readable_runs, short_name, where_stopped
from reporting.target_loss import target_table

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
PAPER_BUDGETS = frozenset(budget for _, _, budget in PAPER_VAL_LOSS)
PAPER_CITATION = "Yuan et al., MARS, ICML 2025 (arXiv 2411.10438), via the AGI-Arena/MARS README"
# Validation perplexity on C4 of the full-rank Adam baseline: Zhao et al., "GaLore: Memory-Efficient LLM Training
# by Gradient Low-Rank Projection", ICML 2024, arXiv 2403.03507v2, Table 2, row Full-Rank; by LLaMA size and the
# steps of its run (jiaweizzhao/GaLore scripts/benchmark_c4/llama_<size>.sh:10, the paper's Table 5).
LITERATURE_PERPLEXITY = {
    ("c4", "llama-60m", 10_000): {"adamw": 34.06},
    ("c4", "llama-130m", 20_000): {"adamw": 25.08},
    ("c4", "llama-350m", 60_000): {"adamw": 18.80},
    ("c4", "llama-1b", 100_000): {"adamw": 15.56},
}
LITERATURE_CITATION = "Zhao et al., GaLore, ICML 2024 (arXiv 2403.03507v2), Table 2, row Full-Rank (Adam)"
PERPLEXITY_CORPORA = frozenset(corpus for corpus, _, _ in LITERATURE_PERPLEXITY)
PRESET_DIR = Path(__file__).resolve().parents[1] / "configs" / "experiment"
PAPER_ROWS = [label for entry in OPTIMIZERS.values() for label in entry.paper_rows]  # the optimizers the paper ran
PRESET_NAME = re.compile(r"(?P<corpus>owt|fwe)-gpt2-(?P<model>small|medium|large|xl)-(?P<billions>\d+)b-"
                         rf"(?P<optimizer>{'|'.join(PAPER_ROWS)})")
PRESET_CORPORA = {"owt": "openwebtext", "fwe": "fineweb-edu"}
MISSING = "–"
STOPPED = "*"  # marks a figure that includes runs stopped before their max_iters
DEFAULT_OUT_NAME = "val_loss_table.md"
TARGET_OUT_NAME = "val_loss_table_target_{}.md"  # with --target-loss: beside the plain table

log = logging.getLogger(__name__)


def load_wandb_csv(path: Path) -> list[Run]:
    """One run per ``<run name> - val/loss`` column of a wandb chart export; the name must be a preset's."""
    header, *rows = read_csv(path) or [[]]
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
        try:
            records = [{"step": int(float(row[step_column])), "val/loss": float(row[column])}
                       for row in rows if row[column].strip()]
        except ValueError as err:  # a cell that is not a number
            raise ValueError(f"{path}, column {title!r}: {err}: export the chart again from wandb") from None
        runs.append(Run(name=f"{path}:{name}", corpus=PRESET_CORPORA[parts["corpus"]], model=parts["model"],
                        optimizer=parts["optimizer"], budget=int(parts["billions"]) * 1e9, setting=name,
                        records=records, max_iters=preset_max_iters(name)))
    return runs


def read_csv(path: Path) -> list[list[str]]:
    """The rows of a CSV file, each as long as its header; a file that is not one stops with a line naming it."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as err:
        raise ValueError(f"{path} cannot be read ({err.strerror})") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"{path} is not a CSV text file ({err}): export the chart again from wandb") from None
    short = next((number for number, row in enumerate(rows[1:], 2) if len(row) != len(rows[0])), None)
    if short is not None:
        raise ValueError(f"{path} line {short} has {len(rows[short - 1])} fields, the header {len(rows[0])}: the "
                         "file is cut short or edited; export the chart again from wandb")
    return rows


def preset_max_iters(name: str) -> int | None:
    """The steps that the preset ``name`` trains for, or None if there is no such preset."""
    path = PRESET_DIR / f"{name}.yaml"
    return OmegaConf.load(path)["train"]["max_iters"] if path.is_file() else None


def format_difference(ours: float | None, paper: float | None, mark: str = "", digits: int = 3) -> str:
    if ours is None and paper is None:
        return MISSING
    if paper is None:
        return f"{ours:.{digits}f}{mark}"
    if ours is None:
        return f"{MISSING} / {paper:.{digits}f}"
    return f"{ours:.{digits}f}{mark} / {paper:.{digits}f} ({ours - paper:+.{digits}f})"


def budget_columns(groups: dict[tuple, list[Setting]], corpus: str) -> list[float]:
    """The budgets a corpus is tabulated at: the paper's, and every budget our runs on it were configured for."""
    return sorted(PAPER_BUDGETS | {budget for c, _, budget, _ in groups if c == corpus})


def within_run_losses(setting: Setting, run_budget: float, budgets: list[float]) -> dict[float, float]:
    """The seeds' mean best validation loss within the first B tokens, for every budget B below the runs' own."""
    losses = {budget: setting.best_val_losses_within(budget) for budget in budgets if budget < run_budget}
    return {budget: statistics.fmean(seeds) for budget, seeds in losses.items() if seeds}


def within_run_bests(groups: dict[tuple, list[Setting]]) -> dict[tuple[str, str, float, str, float], float]:
    """(corpus, model, budget, optimizer, run budget): the best setting's loss within the first budget of its runs."""
    bests: dict[tuple[str, str, float, str, float], float] = {}
    for (corpus, model, run_budget, optimizer), settings in groups.items():
        budgets = budget_columns(groups, corpus)
        for setting in settings:
            for budget, loss in within_run_losses(setting, run_budget, budgets).items():
                key = (corpus, model, budget, optimizer, run_budget)
                bests[key] = min(loss, bests.get(key, math.inf))
    return bests


def legend(within_rows: bool, paper_numbers: bool, stopped: list[Run]) -> list[str]:
    """What the two kinds of row mean, under a table with within-run rows or paper numbers, and where the runs
    behind figures marked STOPPED stopped."""
    sentences = ["Rows named after an optimizer alone: separate runs, each with a cosine schedule that ends at the "
                 "column's budget (the presets of that budget)."]
    if within_rows:
        sentences.append("Rows \"<optimizer>, within <L> run\": the best validation loss within the first B tokens "
                         "(the column's budget) of the runs configured for L tokens, whose learning rate is still "
                         "high at B; the first B tokens end at the step where the preset of budget B stops "
                         "(max_iters x B / L: 10,000 steps for 5B and 40,000 for 20B of a 100,000-step 50B run); "
                         "empty where B is not below L.")
    if paper_numbers:
        sentences.append("The paper's 5B and 20B columns are most likely of the within-run kind: the authors' "
                         "configs define only 100,000-step (50B-token) runs.")
    if stopped:
        sentences.append(f"Figures marked {STOPPED} include runs that stopped before their configured steps "
                         "(preempted and never resumed, killed, or still running): "
                         + where_stopped(stopped) + ".")
    return [" ".join(sentences), ""]


def paper_layout(groups: dict[tuple, list[Setting]]) -> list[str]:
    """Per corpus: rows per optimizer, one column per (model, budget), budgets outermost as in the paper.

    Each optimizer has a row of separate runs and, below it, a row per longer budget L of its runs: the best
    validation loss within the first (column's budget) tokens of those runs.
    """
    within = within_run_bests(groups)
    lines = []
    for corpus in sorted({key[0] for key in groups}):
        if corpus in PERPLEXITY_CORPORA:
            lines += perplexity_layout(groups, corpus)
            continue
        ours = [key[1:] for key in groups if key[0] == corpus]  # (model, budget, optimizer)
        prefixes = {key[1:]: loss for key, loss in within.items() if key[0] == corpus}  # + run budget
        columns = sorted({(model, budget) for model, budget, *_ in [*ours, *prefixes]},
                         key=lambda column: (column[1], size_order(column[0])))
        optimizers = {optimizer for _, _, optimizer in ours}
        optimizers |= {o for column in columns for o in PAPER_VAL_LOSS.get((corpus, *column), {})}
        headers = [f"{display_model(model)}, {tokens_label(budget)} tokens" for model, budget in columns]
        lines += [f"### {display_corpus(corpus)}: best validation loss, ours / paper (difference)", "",
                  "| optimizer | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(columns)]
        stopped = []
        for optimizer in sorted(optimizers, key=optimizer_order):
            papers = [PAPER_VAL_LOSS.get((corpus, *column), {}).get(optimizer) for column in columns]
            cells = []
            for column, paper in zip(columns, papers):
                settings = groups.get((corpus, *column, optimizer))
                best = settings[0] if settings and settings[0].best_val_losses else None
                if best is None:
                    cells.append(format_difference(None, paper))
                    continue
                stopped += best.stopped_runs
                cells.append(format_difference(best.mean_best_val_loss, paper, STOPPED if best.stopped_runs else ""))
            lines.append(f"| {display_optimizer(optimizer)} | " + " | ".join(cells) + " |")
            for run_budget in sorted({run_budget for _, _, o, run_budget in prefixes if o == optimizer}):
                losses = [prefixes.get((*column, optimizer, run_budget)) for column in columns]
                cells = ["" if loss is None else format_difference(loss, paper) for loss, paper in zip(losses, papers)]
                lines.append(f"| {display_optimizer(optimizer)}, within {tokens_label(run_budget)} run | "
                             + " | ".join(cells) + " |")
        paper_numbers = any((corpus, *column) in PAPER_VAL_LOSS for column in columns)
        lines += [""] + (legend(bool(prefixes), paper_numbers, stopped) if prefixes or paper_numbers or stopped
                         else [])
    return lines


def perplexity_layout(groups: dict[tuple, list[Setting]], corpus: str) -> list[str]:
    """A corpus the literature reports in perplexity (C4): rows per optimizer, a column per (model, budget), each
    cell exp of the best setting's best validation loss (the seeds' mean), beside the literature's for a published
    run of the column's model and steps (``LITERATURE_PERPLEXITY``)."""
    ours = [key[1:] for key in groups if key[0] == corpus]  # (model, budget, optimizer)
    columns = sorted({(model, budget) for model, budget, _ in ours}, key=lambda c: (size_order(c[0]), c[1]))
    steps = {column: column_steps(groups, corpus, column) for column in columns}
    published = {column: LITERATURE_PERPLEXITY.get((corpus, column[0], steps[column]), {}) for column in columns}
    optimizers = {optimizer for *_, optimizer in ours} | {o for column in columns for o in published[column]}
    headers = [f"{display_model(model)}, {tokens_label(budget)} tokens"
               + (f" ({steps[model, budget]:,} steps)" if steps[model, budget] else "") for model, budget in columns]
    lines = [f"### {display_corpus(corpus)}: validation perplexity, ours / literature (difference)", "",
             "| optimizer | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(columns)]
    stopped = []
    for optimizer in sorted(optimizers, key=optimizer_order):
        cells = []
        for column in columns:
            settings = groups.get((corpus, *column, optimizer))
            best = settings[0] if settings and settings[0].best_val_losses else None
            stopped += best.stopped_runs if best else []
            mark = STOPPED if best and best.stopped_runs else ""
            ours_ppl = math.exp(best.mean_best_val_loss) if best else None
            cells.append(format_difference(ours_ppl, published[column].get(optimizer), mark, digits=2))
        lines.append(f"| {display_optimizer(optimizer)} | " + " | ".join(cells) + " |")
    sentences = ["Ours: exp of the best validation loss (its evaluations after step 0; seeds: exp of their mean), "
                 "the perplexity of that evaluation (val/perplexity) for one seed. Literature: "
                 f"{LITERATURE_CITATION}, for a run of the column's model and steps; their evaluation averages batch "
                 "means, over one more batch than it scores, where ours averages tokens (docs/c4.md)."]
    if stopped:
        sentences.append(f"Figures marked {STOPPED} include runs that stopped before their configured steps: "
                         + where_stopped(stopped) + ".")
    return lines + ["", " ".join(sentences), ""]


def column_steps(groups: dict[tuple, list[Setting]], corpus: str, column: tuple[str, float]) -> int | None:
    """The steps the runs of a (model, budget) column are configured for, if they agree (else None)."""
    steps = {run.max_iters for (c, *key), settings in groups.items() if c == corpus and tuple(key[:2]) == column
             for setting in settings for run in setting.runs}
    return steps.pop() if len(steps) == 1 else None


def group_order(corpus: str, model: str, budget: float, optimizer: str) -> tuple:
    return corpus, size_order(model), budget, optimizer_order(optimizer)


def settings_table(groups: dict[tuple, list[Setting]]) -> list[str]:
    lines = ["### Every setting (seeds averaged; the best setting of each optimizer is the one in the table above; "
             "within first B: the best validation loss within the first B tokens of these runs)",
             "", "| corpus | model | tokens | optimizer | lr | gamma | other lrs | seeds | best val loss | "
             "final val loss | sd | fixed windows | within first B | runs | code |",
             "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|"]
    any_stopped = any_mixed_code = any_failed = any_left_out = False
    for (corpus, model, budget, optimizer), settings in sorted(groups.items(), key=lambda item: group_order(*item[0])):
        budgets = budget_columns(groups, corpus)
        for setting in settings:
            losses, run = setting.best_val_losses, setting.first
            spread = f"{statistics.stdev(losses):.3f}" if len(losses) > 1 else MISSING
            mark = STOPPED if setting.stopped_runs else ""
            any_stopped |= bool(mark)
            any_failed |= setting.failed
            any_left_out |= bool(setting.left_out)
            best = f"{statistics.fmean(losses):.3f}{mark}" if losses else failed_cell(setting)
            finals = setting.final_val_losses
            final = f"{statistics.fmean(finals):.3f}{mark}" if finals else MISSING
            lr, gamma, other_lrs = number_cell(run.lr), number_cell(run.gamma), other_lrs_cell(run)
            fixed = setting.mean_best_val_loss_fixed
            fixed = MISSING if fixed is None else f"{fixed:.3f}{mark}"
            within = ", ".join(f"{tokens_label(b)}: {loss:.3f}"
                               for b, loss in within_run_losses(setting, budget, budgets).items()) or MISSING
            names = runs_cell(setting)
            any_mixed_code |= len(setting.code) > 1
            lines.append(f"| {display_corpus(corpus)} | {display_model(model)} | {tokens_label(budget)} | "
                         f"{display_optimizer(optimizer)} | {lr} | {gamma} | {other_lrs} | {len(setting.runs)} | "
                         f"{best} | {final} | {spread} | {fixed} | {within} | {names} | "
                         f"{', '.join(setting.code) or MISSING} |")
    lines += ["", "other lrs: the peak rates of the optimizer's other parts (MARS's lr_1d, Muon's adamw_lr), each "
              "point's own: a sweep of lr leaves them where they are unless it moves them too (docs/sweeps.md, "
              "\"What a sweep of lr moves\").",
              "", "best val loss: by each run's procedure (train.eval_sampling; the paper presets: new windows at "
              "every evaluation, as the authors, the figure to compare with the paper), never the step-0 evaluation "
              "of the untrained model; final val loss: the last evaluation's, which shows a late blow-up; fixed "
              "windows: the best on the same windows at every evaluation, which every run scores.",
              "", "code: the commit each launch of the runs ran (train.py logs it), + and the first digits of the "
              "patch's digest where it ran uncommitted changes (saved in the run's code/ directory), – where not "
              "logged."]
    if any_mixed_code:
        lines.append("Settings with more than one code version ran them in different seeds or launches: check "
                     "that the changes between them leave the results alone before comparing.")
    if any_stopped:
        lines += ["", f"Best val losses marked {STOPPED} include runs that stopped before their configured steps: "
                  "the runs column says where."]
    if any_failed:
        lines += ["", "Rows marked failed are sweep points that were refused, diverged or failed otherwise "
                  "(failure.json in the run directory): the runs column gives each one's reason. A failed run is "
                  "never averaged with the healthy seeds of its setting: it has a row of its own, whose best val "
                  "loss is none, or for a diverged run the best it reached before diverging (best before: ...), "
                  "which the first table never takes."]
    if any_left_out:
        lines += ["", "Runs of one setting with the same seed (a sweep run again in another directory) are one run, "
                  "not two seeds: the runs column names the one kept (one that did not fail, then the one that "
                  "trained furthest, then the newest) and, after \"left out:\", the others and why."]
    return lines + [""]


def number_cell(value: float | None) -> str:
    return MISSING if value is None else f"{value:g}"


def other_lrs_cell(run: Run) -> str:
    """``lr_1d 0.003`` for MARS, ``adamw_lr 0.003`` for Muon: the configured rates beside lr, each point's own (its
    saved config, resolved); – for none, or a run read from a wandb export."""
    rates = other_learning_rates(run.config["optimizer"]) if run.config else {}
    return ", ".join(f"{key} {number_cell(value) if isinstance(value, (int, float)) else value}"
                     for key, value in rates.items()) or MISSING


def failed_cell(setting: Setting) -> str:
    """``failed (diverged)`` for a setting of failed runs, ``failed (diverged; best before: 7.592)`` where its
    runs reached a loss before they diverged (their mean); else no loss yet."""
    if not setting.failed:
        return MISSING
    kinds = ", ".join(dict.fromkeys(run.failure["kind"] for run in setting.runs))
    before = [run.best_val_loss_before_diverging for run in setting.runs
              if run.best_val_loss_before_diverging is not None]
    return f"failed ({kinds}; best before: {statistics.fmean(before):.3f})" if before else f"failed ({kinds})"


def runs_cell(setting: Setting) -> str:
    """The runs of a setting by directory name, each with where it stopped or why it failed, then the runs of a
    seed already counted (``left out: ...``)."""
    def note(run: Run) -> str:
        if run.failed:
            return f" ({run.failure_note})"
        return f" (stopped {run.stopped_at})" if run.stopped_early else ""

    names = ", ".join(Path(run.name).name + note(run) for run in setting.runs)
    if setting.left_out:
        names += "; left out: " + ", ".join(f"{short_name(left.run)} ({left.reason})" for left in setting.left_out)
    return names


def labelled_settings(groups: dict[tuple, list[Setting]]) -> list[tuple[tuple, Setting, list[str]]]:
    """Every setting in the order of the table of every setting, with its (corpus, model, budget) and its label
    cells: corpus, model, tokens, optimizer, lr, gamma."""
    rows = []
    for (corpus, model, budget, optimizer), settings in sorted(groups.items(), key=lambda item: group_order(*item[0])):
        for setting in settings:
            labels = [display_corpus(corpus), display_model(model), tokens_label(budget), display_optimizer(optimizer),
                      number_cell(setting.first.lr), number_cell(setting.first.gamma)]
            rows.append(((corpus, model, budget), setting, labels))
    return rows


def make_table(runs: list[Run], target_loss: float | None = None, left_out: list[str] = ()) -> str:
    """The tables of ``runs``, and a list of the run directories ``left_out`` (one note each)."""
    groups = group_settings(runs)
    if not groups:
        raise ValueError("no runs found: nothing to tabulate")
    target = [] if target_loss is None else target_table(labelled_settings(groups), target_loss)
    older = ["Run directories left out:", "", *(f"- {note}" for note in left_out), ""] if left_out else []
    return "\n".join(paper_layout(groups) + settings_table(groups) + target + older
                     + [f"Paper numbers: {PAPER_CITATION}.", ""])


def default_out(sources: list[Path], target_loss: float | None = None) -> Path:
    """val_loss_table.md beside the runs, in the deepest directory that holds every run directory and export; with
    a target loss X, val_loss_table_target_X.md, which leaves the table without it in place."""
    common = Path(os.path.commonpath([source.resolve().parent for source in sources]))
    if common == Path(common.anchor):
        raise ValueError(f"the runs share no directory below {common}: say where the table goes with --out FILE")
    return common / (DEFAULT_OUT_NAME if target_loss is None else TARGET_OUT_NAME.format(f"{target_loss:g}"))


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m scripts.make_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", help="run directories or glob patterns (quote them)")
    parser.add_argument("--wandb-csv", type=Path, nargs="*", default=[], help="wandb chart exports of val/loss")
    parser.add_argument("--out", type=Path, help=f"markdown file to write (default: {DEFAULT_OUT_NAME} in the "
                        "deepest directory holding every run and wandb export; with --target-loss X, "
                        f"{TARGET_OUT_NAME.format('X')}); a file there is replaced, saying so")
    parser.add_argument("--target-loss", type=float, metavar="X", help="also tabulate the tokens and training time "
                        "each setting took to reach validation loss X, and their ratio to the first optimizer's")
    args = parser.parse_args(argv)
    try:
        run_dirs = find_run_dirs(args.runs)
        runs, left_out = readable_runs(run_dirs)
        runs += [run for path in args.wandb_csv for run in load_wandb_csv(path)]
        table = make_table(runs, args.target_loss, left_out)
        out = args.out or default_out([*run_dirs, *args.wandb_csv], args.target_loss)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    print(table)
    command = shlex.join(["python", "-m", "scripts.make_table", *argv])
    replaced = out.exists()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(f"<!-- {command} ({datetime.date.today()}) -->\n\n{table}")
    except OSError as err:  # a full disk, a read-only directory: the table is on screen all the same
        raise SystemExit(unwritable_output(err, out)) from None
    log.info("%s %s", "replaced" if replaced else "wrote", out)


if __name__ == "__main__":
    main()
