"""Validation loss against tokens and against training time, one figure per model size, like the MARS paper's.

    python -m scripts.plot_curves 'outputs/**' 'multirun/2026-11-*' [--out results/curves] [--every-point]

For each corpus and model size, writes ``val_loss_vs_tokens_<corpus>_<model>.png`` and
``val_loss_vs_time_<corpus>_<model>.png`` under ``--out``: one line per optimizer (and token budget), from the
setting with the best validation loss (see scripts/make_table.py), labelled with what sets it apart when there
were several (``MARS-approx (gamma=0.05, best of 2 settings)``). With several seeds the line is their mean and
the band spans their lowest and highest loss, at the evaluations every seed has. Long runs (``ZOOM_EVALUATIONS``
evaluations or more) are drawn as the paper does, from the best loss to one unit above it; short ones in full,
from the first evaluation. Training time is the sum of the logged ``step_ms`` (training steps only: evaluation
and checkpointing are left out), read at each evaluation. Where runs of one optimizer and batch, which do the same
work per step, went at speeds more than ``SPEED_SPREAD`` apart (their median tokens/s), as on a machine shared with
other jobs, the time figure says so under the axes, and the command warns: their time axis then shows the load.

A line drawn from a run whose last logged step is short of its max_iters (preempted and never resumed, killed,
or still running: ``Run.stopped_early``) ends where that run stopped, even if its other seeds went further. Its
label says so, naming such runs and where they stopped as the table does
(``AdamW (2 seeds; stopped: adamw-seed2 at step 1,200 of 10,000)``), and a warning is logged for each.

With ``--every-point``, ``val_loss_vs_{tokens,time}_<corpus>_<model>_every_point.png`` draw every setting (every
point of a sweep, seeds averaged) instead of each optimizer's best, labelled by the values that set it apart
(``MARS-approx, gamma=0.005``) in numeric order, one hue per optimizer and its settings in shades of it. A failed
point (refused, diverged: its ``failure.json``) is dashed up to its last evaluation, and a cross in a band above
the axes, named "failed", marks the step where it failed, visible whatever that step (one that failed before its
first evaluation after step 0 is no mark under every line's start); its label says how and where it failed. The y
axis spans what the healthy runs span: a failed run's evaluations above it (a blow-up to a val loss of 981) are
triangles on the top edge, and a note under the axes says so. A setting with no finite loss to draw (a refused
point, or a run whose every val loss is NaN, as a float16 evaluation that overflowed writes) has no line and no
legend entry: it is listed under the axes with what it is, beside the healthy runs' lines.
"""
import logging
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from reporting.failure_band import FailedBand  # noqa: E402
from reporting.figures import plot_command  # noqa: E402
from reporting.run_labels import (display_corpus, display_model, display_optimizer, numeric_order,  # noqa: E402
                                optimizer_order, tokens_label)
from reporting.run_reading import Run, training_seconds  # noqa: E402
from reporting.run_selection import (Setting, group_settings, setting_differences, setting_labels,  # noqa: E402
                                   where_stopped)

log = logging.getLogger(__name__)

TOKEN_UNITS = (("billions", 1e9), ("millions", 1e6), ("thousands", 1e3), ("", 1.0))
TIME_UNITS = (("hours", 3600.0), ("minutes", 60.0), ("seconds", 1.0))
ZOOM_EVALUATIONS = 20  # from this many evaluations per curve on, the first steps (from ~10.9) are cut off
CYCLE_COLORS = 10  # lines the default colour cycle tells apart; more are drawn from tab20
CLIPPED_NOTE = "y axis: the healthy runs' range; ▲ evaluations of failed runs above it"
NOT_DRAWN_NOTE = "not drawn, no finite loss:"
TRIANGLE_SPACING = 0.04  # in axes heights, between the triangles of runs that left the frame at one x
# Runs of one optimizer and batch (the same work per step) whose speeds differ by more than this factor ran under
# different loads (a machine shared with other jobs): their training time measures the load as much as the optimizer.
SPEED_SPREAD = 1.25
SPEED_NOTE = "same work, other speeds (a machine under another load?), so the time axis shows the load too:"
# The colour maps of --every-point, one per optimizer: sequential, so that shades of one tell its settings apart.
SHADES = ("Blues", "Oranges", "Greens", "Reds", "Purples", "Greys", "YlOrBr", "PuRd")


def seed_curves(setting: Setting) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, seconds, loss) per seed at the evaluation steps every seed has: arrays of (seeds, evaluations)."""
    shared = sorted(set.intersection(*({r["step"] for r in run.evaluations} for run in setting.runs)))
    # (An empty list for a run without evaluations: a point refused before it trained.)
    steps = np.array(shared)
    tokens, seconds, losses = [], [], []
    for run in setting.runs:
        at_step = {r["step"]: r for r in run.evaluations}
        tokens.append([at_step[s]["tokens"] for s in shared])
        losses.append([at_step[s]["val/loss"] for s in shared])
        seconds.append(training_seconds(run, steps))
    return steps, np.array(tokens, dtype=float), np.array(seconds), np.array(losses)


def pick_unit(largest: float, units: tuple[tuple[str, float], ...]) -> tuple[str, float]:
    """The largest unit that the largest value reaches (the last unit if none)."""
    return next(((name, scale) for name, scale in units if largest >= scale), units[-1])


def curve_label(name: str, setting: Setting, *more_notes: str) -> str:
    """The legend label of the line of ``setting``: its name, how many seeds it averages, and which of them
    stopped before their max_iters, as the line ends where they did, then ``more_notes``, all in one bracket
    (``AdamW (2 seeds; stopped: adamw-seed2 at step 1,200 of 10,000)``)."""
    notes = [f"{len(setting.runs)} seeds"] if len(setting.runs) > 1 else []
    if setting.stopped_runs:
        notes.append(f"stopped: {where_stopped(setting.stopped_runs)}")
    if setting.failed:
        notes.append(", ".join(run.failed_at for run in setting.runs))
    notes += more_notes
    return f"{name} ({'; '.join(notes)})" if notes else name


def plot_group(lines: list[tuple[str, Setting]], x_axis: str, title: str, path: Path,
               colors: list | None = None) -> None:
    figure = group_figure(lines, x_axis, title, colors)
    figure.savefig(path, dpi=150, bbox_inches="tight")  # with the legend beside the axes
    plt.close(figure)


def group_figure(lines: list[tuple[str, Setting]], x_axis: str, title: str,
                 colors: list | None = None) -> plt.Figure:
    """One line per (name, setting) in ``lines``, against training tokens or time (``x_axis``), in ``colors`` (by
    default the colour cycle). A setting with no finite loss to draw (refused before it trained, or every evaluation
    NaN, as an overflowed float16 evaluation writes) has no line nor legend entry: it is listed under the axes with
    what it is. A failed setting's line is dashed, and a cross in the band above the axes marks where it failed."""
    figure, axes = plt.subplots(figsize=(6, 4.5))
    if len(lines) > CYCLE_COLORS:
        axes.set_prop_cycle(color=plt.cm.tab20.colors)
    curves = [(curve_label(name, setting), *seed_curves(setting), setting.failed) for name, setting in lines]
    column = 2 if x_axis == "tokens" else 3  # (label, steps, tokens, seconds, losses, failed)
    unit, scale = pick_unit(max(curve[column].max(initial=0.0) for curve in curves),
                            TOKEN_UNITS if x_axis == "tokens" else TIME_UNITS)
    drawn, not_drawn, band = [], [], FailedBand(axes)
    for index, ((label, _, tokens, seconds, losses, failed), (name, setting)) in enumerate(zip(curves, lines)):
        if not np.isfinite(losses).any():
            not_drawn.append(curve_label(name, setting, nothing_to_draw(setting, losses)))
            continue
        x = (tokens if x_axis == "tokens" else seconds).mean(axis=0) / scale
        [line] = axes.plot(x, losses.mean(axis=0), label=label, linestyle="--" if failed else "-",
                           color=None if colors is None else colors[index])
        if len(losses) > 1:
            axes.fill_between(x, losses.min(axis=0), losses.max(axis=0), alpha=0.2, color=line.get_color())
        if failed:  # where it failed, whatever its last evaluation (none after step 0, for one that failed early)
            band.mark(failure_x(setting.first, x_axis) / scale, "x", line.get_color())
        drawn.append((x, losses, failed, line.get_color()))
    quantity = "training tokens" if x_axis == "tokens" else "training time"
    axes.set_xlabel(f"{quantity} ({unit})" if unit else quantity)
    axes.set_ylabel("validation loss")
    notes = [set_loss_range(axes, drawn)] if drawn else []
    if x_axis == "time":
        notes.append(speed_spread_note([setting for _, setting in lines]))
    if not_drawn:
        notes.append("\n".join([NOT_DRAWN_NOTE, *not_drawn]))
    if any(notes):  # under the x label
        axes.text(0, -0.16, "\n".join(filter(None, notes)), transform=axes.transAxes, va="top", fontsize="small")
    axes.set_title(title)
    band.close()
    axes.grid(alpha=0.3)
    figure.tight_layout()  # for the axes alone: the file, saved with bbox_inches="tight", takes the legend in
    if drawn:  # beside the axes: a sweep's every point makes a long legend, which inside would hide the curves
        axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small")
    return figure


def speed_spread_note(settings: list[Setting]) -> str:
    """For a figure against training time: the optimizers whose runs did the same work per step (one optimizer and
    batch, in one model's figure; their lr or gamma costs nothing) at speeds more than ``SPEED_SPREAD`` apart, each
    run's median tokens/s, with the range; empty where there are none. Logged as a warning too."""
    speeds: dict[tuple[str, float], list[float]] = {}
    for run in (run for setting in settings for run in setting.runs):
        rates = [record["tokens_per_s"] for record in run.records if "tokens_per_s" in record]
        if rates and run.max_iters:
            speeds.setdefault((run.optimizer, run.budget / run.max_iters), []).append(statistics.median(rates))
    spread = [f"{display_optimizer(optimizer)} {min(rates):,.0f}-{max(rates):,.0f} tokens/s ({len(rates)} runs)"
              for (optimizer, _), rates in speeds.items() if max(rates) > SPEED_SPREAD * min(rates)]
    for each in spread:
        log.warning("%s %s", SPEED_NOTE, each)
    return "\n".join([SPEED_NOTE, *spread]) if spread else ""


def failure_x(run: Run, x_axis: str) -> float:
    """Where ``run`` failed on the x axis: the tokens or the training time of its failure's step."""
    step = run.failure.get("step", 0)
    if x_axis == "tokens":
        return step * run.budget / run.max_iters if run.max_iters else 0.0
    return float(training_seconds(run, np.array([step]))[0])


def optimizer_shades(lines: list[tuple[str, Setting]]) -> list:
    """A colour per line: one hue per optimizer (and budget), in the order the optimizers come, its settings in
    shades of it from dark to light, so that the lines of one sweep read as one family."""
    families = list(dict.fromkeys((setting.first.optimizer, setting.first.budget) for _, setting in lines))
    members = {family: [] for family in families}
    for index, (_, setting) in enumerate(lines):
        members[setting.first.optimizer, setting.first.budget].append(index)
    colors = [None] * len(lines)
    for family, indices in members.items():
        colormap = plt.get_cmap(SHADES[families.index(family) % len(SHADES)])
        for shade, index in zip(np.linspace(0.95, 0.4, len(indices)) if len(indices) > 1 else [0.7], indices):
            colors[index] = colormap(shade)
    return colors


def nothing_to_draw(setting: Setting, losses: np.ndarray) -> str:
    """Why a setting has no line: ``no evaluation`` (refused before it trained), or ``every val loss NaN: run-a at
    3 evaluations`` (a float16 evaluation that overflowed writes NaN)."""
    if not losses.size:
        return "no evaluation"
    runs = ", ".join(f"{Path(run.name).name} at {len(run.evaluations)} evaluations" for run in setting.runs)
    return f"every val loss NaN: {runs}"


def set_loss_range(axes: plt.Axes, curves: list[tuple[np.ndarray, np.ndarray, bool, str]]) -> str:
    """The y range of ``curves`` (x, losses per seed, failed, colour), each with a finite loss: what the healthy ones
    span, so that one run that blew up (a val loss of 981) does not flatten the rest; its evaluations above the range
    are triangles on the top edge, and the note returned says so (empty if none). Long runs are zoomed as the paper
    does."""
    healthy = [losses for _, losses, failed, _ in curves if not failed] or [losses for _, losses, _, _ in curves]
    lowest = min(np.nanmin(losses.mean(axis=0)) for _, losses, _, _ in curves)
    highest = max(np.nanmax(losses) for losses in healthy)
    top = highest
    if min(losses.shape[1] for _, losses, _, _ in curves) >= ZOOM_EVALUATIONS:
        # As in the paper's figures: the last unit of loss above the best, not the first steps from ~10.9.
        top = min(highest, lowest + 1.0)
    axes.set_ylim(lowest - 0.05, top + 0.05)
    escaped, triangles_at = [], {}
    for x, losses, _, color in curves:
        mean = losses.mean(axis=0)
        beyond = ~(mean <= highest + 0.05)  # a NaN evaluation left the frame too
        if beyond.any():
            heights = []
            for at in x[beyond].tolist():  # below the triangles of other runs at the same x, so that each is seen
                heights.append(1 - TRIANGLE_SPACING * triangles_at.get(at, 0))
                triangles_at[at] = triangles_at.get(at, 0) + 1
            axes.plot(x[beyond], heights, transform=axes.get_xaxis_transform(), linestyle="none", marker="^",
                      color=color, clip_on=False)
            escaped += mean[beyond].tolist()
    return f"{CLIPPED_NOTE} (up to {np.nanmax(escaped):.4g})" if escaped else ""


def plot_curves(runs: list[Run], out: Path, every_point: bool = False) -> list[Path]:
    """Write both figures for every (corpus, model) among ``runs``; returns the files written."""
    if every_point:
        return plot_every_point(runs, out)
    figures: dict[tuple[str, str], list[tuple[float, str, Setting, str]]] = {}
    for (corpus, model, budget, optimizer), settings in group_settings(runs).items():
        best = settings[0]
        if best.best_val_losses:
            picked = f" ({setting_labels(settings)[0]}, best of {len(settings)} settings)" if len(settings) > 1 else ""
            figures.setdefault((corpus, model), []).append((budget, optimizer, best, picked))
            for run in best.stopped_runs:
                log.warning("%s stopped %s: the %s line of %s, %s, %s tokens ends by then", Path(run.name).name,
                            run.stopped_at, display_optimizer(optimizer), display_model(model),
                            display_corpus(corpus), tokens_label(budget))
    if not figures:
        raise ValueError("no runs with an evaluation: nothing to plot")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (corpus, model), entries in sorted(figures.items()):
        entries.sort(key=lambda entry: (entry[0], optimizer_order(entry[1])))
        several_budgets = len({budget for budget, *_ in entries}) > 1
        lines = [(display_optimizer(optimizer) + (f", {tokens_label(budget)} tokens" if several_budgets else "")
                  + picked, setting) for budget, optimizer, setting, picked in entries]
        for x_axis in ("tokens", "time"):
            path = out / f"val_loss_vs_{x_axis}_{corpus}_{model}.png"
            plot_group(lines, x_axis, f"{display_model(model)}, {display_corpus(corpus)}", path)
            written.append(path)
    return written


def every_point_lines(runs: list[Run]) -> dict[tuple[str, str], list[tuple[str, Setting]]]:
    """Per (corpus, model): every setting, labelled by its optimizer (and budget, where several) and the values
    that set it apart from the other settings of its optimizer, in numeric order of those values."""
    groups = group_settings(runs)
    figures: dict[tuple[str, str], list[tuple[tuple, str, Setting]]] = {}
    for (corpus, model, budget, optimizer), settings in groups.items():
        several_budgets = len({key[2] for key in groups if key[:2] == (corpus, model)}) > 1
        name = display_optimizer(optimizer) + (f", {tokens_label(budget)} tokens" if several_budgets else "")
        for setting, values, differences in zip(settings, setting_differences(settings), setting_labels(settings)):
            label = ", ".join(filter(None, [name, differences]))
            order = (budget, optimizer_order(optimizer), numeric_order(values.values()), setting.failed)
            figures.setdefault((corpus, model), []).append((order, label, setting))
    return {key: [(label, setting) for _, label, setting in sorted(entries, key=lambda entry: entry[0])]
            for key, entries in figures.items()}


def plot_every_point(runs: list[Run], out: Path) -> list[Path]:
    """Both figures for every (corpus, model), with a line for every setting; returns the files written."""
    figures = {key: lines for key, lines in every_point_lines(runs).items()
               if any(run.evaluations for _, setting in lines for run in setting.runs)}
    if not figures:
        raise ValueError("no runs with an evaluation: nothing to plot")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (corpus, model), lines in sorted(figures.items()):
        for x_axis in ("tokens", "time"):
            path = out / f"val_loss_vs_{x_axis}_{corpus}_{model}_every_point.png"
            plot_group(lines, x_axis, f"{display_model(model)}, {display_corpus(corpus)}: every setting", path,
                       colors=optimizer_shades(lines))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    plot_command("python -m scripts.plot_curves", __doc__, "results/curves", plot_curves, argv,
                 add_options=lambda parser: parser.add_argument(
                     "--every-point", action="store_true", help="draw every setting (every point of a sweep), not "
                     "each optimizer's best: *_every_point.png"))


if __name__ == "__main__":
    main()
