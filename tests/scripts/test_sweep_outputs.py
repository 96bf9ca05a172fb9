"""A six-point sweep with a diverged and a refused point: the table and both figures show every point."""
from pathlib import Path

import matplotlib.pyplot as plt

from reporting.failure_band import FAILED_NOTE
from reporting.run_selection import load_runs
import scripts.plot_curves as plot_curves_module
from scripts.make_table import make_table
from scripts.plot_sweep import panel_figure, sweep_lines

TINY = ["model=tiny", "data=embedded", "train.max_iters=100"]
GAMMAS = (0.005, 0.025, 0.05, 0.1)


def write_sweep(sweep: Path, make_run, make_failure) -> None:
    """multirun/<date>/<time>/<n>_<overrides>, as train.py -m names them: gammas, one diverged, one refused."""
    mars = [*TINY, "optimizer=mars-adamw"]
    for n, gamma in enumerate(GAMMAS):
        make_run(sweep / f"{n}_optimizer.gamma={gamma}", [*mars, f"optimizer.gamma={gamma}"],
                 [10.8, 7.0, 6.0 + gamma], 1024)
    diverged = [*mars, "optimizer.gamma=1.0"]
    make_failure(make_run(sweep / "4_optimizer.gamma=1.0", diverged, [10.8], 1024, eval_steps=[0]),
                 "diverged", "the loss is nan at step 7", 6, diverged)
    make_failure(sweep / "5_optimizer.gamma=-1.0", "refused", "optimizer.gamma must be >= 0, got -1.0", 0,
                 [*mars, "optimizer.gamma=-1.0"])


def test_the_table_and_the_figures_show_every_point_of_a_sweep(tmp_path, make_run, make_failure, monkeypatch):
    sweep = tmp_path / "multirun" / "2026-11-25" / "06-00-00"
    write_sweep(sweep, make_run, make_failure)
    runs = load_runs([str(tmp_path / "multirun" / "**")])
    assert len(runs) == 6

    table = make_table(runs)
    rows = [line for line in table.splitlines() if line.startswith("| Shakespeare (embedded) | 4x128 | 102K |")]
    assert sorted(row.split("|")[6].strip() for row in rows) == ["-1", "0.005", "0.025", "0.05", "0.1", "1"]
    assert sum("failed (diverged)" in row for row in rows) == 1 and sum("failed (refused)" in row for row in rows) == 1

    [[line]] = sweep_lines(runs, "gamma").values()
    assert line.x == list(GAMMAS) and [x for x, _ in line.failed] == [1.0] and [x for x, _ in line.refused] == [-1.0]
    plt.close(panel_figure([line], "gamma", "sweep"))

    drawn = []
    monkeypatch.setattr(plot_curves_module, "plot_group", lambda lines, *args, **kwargs: drawn.append(lines))
    plot_curves_module.plot_curves(runs, tmp_path / "curves", every_point=True)
    names = [f"MARS-approx, gamma={gamma}" for gamma in (-1.0, *GAMMAS, 1.0)]
    assert [label for label, _ in drawn[0]] == names
    figure = plot_curves_module.group_figure(drawn[0], "tokens", "every point")
    legend = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    assert legend == [*names[1:-1], f"{names[-1]} (diverged at step 6)"]  # the refused point draws nothing...
    assert [text.get_text() for text in figure.axes[0].texts] == [  # ...and is listed under the axes
        f"{plot_curves_module.NOT_DRAWN_NOTE}\n{names[0]} (refused; no evaluation)", FAILED_NOTE]
    plt.close(figure)
