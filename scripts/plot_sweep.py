"""Best validation loss against the learning rate and against MARS's gamma: what a sweep found, as figures.

    python -m scripts.plot_sweep 'multirun/2026-11-*' [--out results/sweeps]

For each corpus, model size and token budget, writes ``lr_sweep_<corpus>_<model>_<tokens>.png`` (log-scale lr)
and, where gamma was swept, ``gamma_sweep_<corpus>_<model>_<tokens>.png``. A line joins the settings that differ
only in the swept value (and, for lr, in train.min_lr and in a second learning rate held fixed or at one ratio to
lr: MARS's lr_1d, Muon's adamw_lr), so an AdamW sweep and a MARS sweep at each gamma are separate lines; a point
is the mean over seeds of each run's best validation loss, its bar spans the seeds' lowest and highest.

A point whose seeds include a run whose last logged step is short of its max_iters (preempted and never resumed,
killed, or still running: ``Run.stopped_early``) is drawn hollow, and the legend says what that means: such a
run's best loss is that of the steps it reached, short of those configured (make_table marks such figures
``*``). A warning names such runs and where they stopped. A point that diverged or failed while it trained (its
``failure.json``) has no loss to place: its loss is beyond any healthy one (a blow-up) or none, so it is a triangle
pointing up in a band above the axes, named "failed", where no value can reach (triangles at one value stacked
upwards), in its line's colour, never among the values nor at the low end where the best points are; its legend entry says how and where it failed (``MARS-approx, lr 10:
diverged at step 30``), and the table gives its reason. A refused point never ran, and its value may be one no axis
should show (gamma = -0.1): it is listed under the axes with its reason, not drawn. Lines are in the order of the
optimizers, then of the value held fixed, in numeric order. A figure whose every point failed is not written: one
line says so.
"""
import json
import logging
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from reporting.figures import plot_command  # noqa: E402
from reporting.failure_band import FailedBand  # noqa: E402
from reporting.run_labels import (display_corpus, display_model, display_optimizer, numeric_order,  # noqa: E402
                                optimizer_order, tokens_label)
from reporting.run_reading import Run  # noqa: E402
from reporting.run_selection import Setting, group_settings, where_stopped  # noqa: E402

log = logging.getLogger(__name__)
SWEPT = {"lr": "learning rate", "gamma": "gamma (MARS)"}
STOPPED_NOTE = "hollow: includes runs stopped before their configured steps"
REFUSED_NOTE = "refused, not drawn:"
NOTE_WIDTH = 68  # characters a line of the note under the axes holds at most: no wider than the axes


@dataclass
class SweepLine:
    label: str
    x: list[float] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    stopped: list[list[Run]] = field(default_factory=list)  # per point, its seeds that stopped before max_iters
    failed: list[tuple[float, Run]] = field(default_factory=list)  # (swept value, run) of each point that failed
    refused: list[tuple[float, Run]] = field(default_factory=list)  # (swept value, run) of each refused point


# Learning rates that an lr sweep may move with the swept one (MARS's lr_1d, Muon's AdamW part) or hold fixed.
LR_FOLLOWERS = ("lr_1d", "adamw_lr")


def without(run: Run, key: str) -> str:
    """The run's setting with ``optimizer.<key>`` left out: settings along one sweep line share it.

    An lr sweep moves ``train.min_lr`` with the lr (a tenth of it, say) or not: that is left out too, and so are
    the ``LR_FOLLOWERS``, which :func:`split_by_followers` then sorts out.
    """
    fields = json.loads(run.setting)
    fields["optimizer"].pop(key, None)
    if key == "lr":
        fields["train"].pop("min_lr", None)
        for follower in LR_FOLLOWERS:
            fields["optimizer"].pop(follower, None)
    return json.dumps(fields, sort_keys=True)


def split_by_followers(members: list[Setting]) -> list[list[Setting]]:
    """Settings of one lr sweep, as lines: one line if each follower lr is fixed, or at one ratio to lr (as the
    authors' configs and scripts.small_study keep MARS's lr_1d at lr / 2); else one line per ratio."""
    def followers(setting: Setting, as_ratio: bool) -> tuple:
        optimizer = setting.first.config["optimizer"]
        return tuple(float(f"{optimizer[f] / optimizer['lr']:.6g}") if as_ratio else optimizer[f]
                     for f in LR_FOLLOWERS if f in optimizer)

    for as_ratio in (False, True):
        if len({followers(setting, as_ratio) for setting in members}) == 1:
            return [members]
    lines: dict[tuple, list[Setting]] = {}
    for setting in members:
        lines.setdefault(followers(setting, as_ratio=True), []).append(setting)
    return list(lines.values())


def sweep_lines(runs: list[Run], parameter: str) -> dict[tuple[str, str, float], list[SweepLine]]:
    """Lines of at least two values of ``parameter`` (lr or gamma), per (corpus, model, budget)."""
    panels: dict[tuple[str, str, float], list[SweepLine]] = {}
    for (corpus, model, budget, optimizer), settings in sorted(
            group_settings(runs).items(), key=lambda item: optimizer_order(item[0][3])):
        groups: dict[str, list[Setting]] = {}
        for setting in settings:
            if getattr(setting.first, parameter) is not None and (setting.best_val_losses or setting.failed):
                groups.setdefault(without(setting.first, parameter), []).append(setting)
        lines = [line for members in groups.values()
                 for line in (split_by_followers(members) if parameter == "lr" else [members])]
        other = "gamma" if parameter == "lr" else "lr"
        lines.sort(key=lambda members: numeric_order([getattr(members[0].first, other)]))
        for members in lines:
            if len(members) < 2:
                continue
            members.sort(key=lambda s: getattr(s.first, parameter))
            fixed = getattr(members[0].first, other)
            several = sum(len(m) >= 2 for m in lines) > 1
            label = display_optimizer(optimizer) + (f", {other} {fixed:g}" if several and fixed is not None else "")
            line = SweepLine(label)
            for setting in members:
                if setting.failed:
                    for run in setting.runs:
                        kept = line.refused if run.failure["kind"] == "refused" else line.failed
                        kept.append((getattr(setting.first, parameter), run))
                    continue
                losses = setting.best_val_losses
                line.x.append(getattr(setting.first, parameter))
                line.mean.append(setting.mean_best_val_loss)
                line.low.append(min(losses))
                line.high.append(max(losses))
                line.seeds.append(len(losses))
                line.stopped.append(setting.stopped_runs)
                if setting.stopped_runs:
                    log.warning("%s, %s, %s tokens, %s at %s %g: includes runs that stopped before their configured "
                                "steps: %s", display_model(model), display_corpus(corpus), tokens_label(budget),
                                label, parameter, line.x[-1], where_stopped(setting.stopped_runs))
            panels.setdefault((corpus, model, budget), []).append(line)
    return panels


def plot_panel(lines: list[SweepLine], parameter: str, title: str, path: Path) -> None:
    figure = panel_figure(lines, parameter, title)
    figure.savefig(path, dpi=150, bbox_inches="tight")  # with the legend beside the axes
    plt.close(figure)


def panel_figure(lines: list[SweepLine], parameter: str, title: str) -> plt.Figure:
    """The ``lines`` against the swept ``parameter``; points with stopped runs hollow, and the legend says so;
    failed points triangles in a band above the axes, refused ones listed under the axes."""
    figure, axes = plt.subplots(figsize=(6, 4.5))
    handles, failed, band = [], [], FailedBand(axes)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, line in enumerate(lines):
        color = colors[index % len(colors)]
        if line.x:  # a line whose every point failed has no curve, nor a legend entry of its own
            errors = [[m - lo for m, lo in zip(line.mean, line.low)], [hi - m for m, hi in zip(line.mean, line.high)]]
            handles.append(axes.errorbar(line.x, line.mean, yerr=errors, marker="o", capsize=3, label=line.label,
                                         color=color))
            draw_stopped(axes, line, handles[-1].lines[0])
        for x, run in line.failed:
            failed.append(failed_point(band, line, x, run, parameter, color))
    handles += failed
    if any(runs for line in lines for runs in line.stopped):
        handles.append(Line2D([], [], linestyle="none", marker="o", markerfacecolor="white", markeredgecolor="gray",
                              label=STOPPED_NOTE))
    if parameter == "lr":
        axes.set_xscale("log")
    axes.set_xlabel(SWEPT[parameter])
    axes.set_ylabel("best validation loss (mean over seeds; bars: min-max)")
    axes.set_title(title)
    band.close()
    axes.grid(alpha=0.3)
    refused = [textwrap.fill(f"{line.label}, {parameter} {x:g}: {run.failure['reason']}", NOTE_WIDTH,
                             subsequent_indent="  ") for line in lines for x, run in line.refused]
    if refused:  # under the x label, one line each
        axes.text(0, -0.16, "\n".join([REFUSED_NOTE, *refused]), transform=axes.transAxes, va="top",
                  fontsize="small")
    figure.tight_layout()  # for the axes alone: the file, saved with bbox_inches="tight", takes the legend in
    # Beside the axes, where it hides no point: its entries are names, so it is no wider than the axes.
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1), fontsize="small")
    return figure


def draw_stopped(axes: plt.Axes, line: SweepLine, mean_line: Line2D) -> None:
    """Hollow markers over the points that include stopped runs: over the filled markers, which errorbar draws
    above its bars, in the line's colour."""
    stopped = [(x, mean) for x, mean, runs in zip(line.x, line.mean, line.stopped) if runs]
    if stopped:
        axes.plot(*zip(*stopped), linestyle="none", marker="o", color=mean_line.get_color(),
                  markerfacecolor="white", zorder=mean_line.get_zorder() + 0.1)


def failed_point(band: FailedBand, line: SweepLine, x: float, run: Run, parameter: str, color) -> Line2D:
    """A triangle pointing up in the band of failed points above the axes where a failed point lies, and its legend
    entry: the line, the value and how it failed (its reason is long: the table gives it)."""
    band.mark(x, "^", color)
    return Line2D([], [], label=f"{line.label}, {parameter} {x:g}: {run.failed_at}", linestyle="none", marker="^",
                  markersize=8, color=color)


def plot_sweeps(runs: list[Run], out: Path) -> list[Path]:
    """A figure per swept parameter and (corpus, model, budget); none, but a line saying so, where every point
    failed: an empty figure would say nothing."""
    written, all_failed = [], []
    for parameter in SWEPT:
        for (corpus, model, budget), lines in sorted(sweep_lines(runs, parameter).items()):
            title = f"{display_model(model)}, {display_corpus(corpus)}, {tokens_label(budget)} tokens"
            if not any(line.x for line in lines):
                all_failed.append(f"every point of the {parameter} sweep of {title} failed")
                continue
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"{parameter}_sweep_{corpus}_{model}_{tokens_label(budget)}.png"
            plot_panel(lines, parameter, title, path)
            written.append(path)
    if not written:
        raise ValueError(f"{'; '.join(all_failed)}: nothing to plot (scripts.make_table gives each one's reason)"
                         if all_failed else "no setting was run at two or more values of lr or gamma: nothing to plot")
    for nothing in all_failed:
        log.info("%s: nothing to draw (scripts.make_table gives each one's reason)", nothing)
    return written


def main(argv: list[str] | None = None) -> None:
    plot_command("python -m scripts.plot_sweep", __doc__, "results/sweeps", plot_sweeps, argv)


if __name__ == "__main__":
    main()
