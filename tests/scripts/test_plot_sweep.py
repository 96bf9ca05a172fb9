"""Best validation loss against lr and gamma: one line per setting that differs only in the swept value."""
import logging
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import same_color

from reporting.failure_band import FAILED_BAND, FAILED_NOTE, FAILED_SPACING
from reporting.run_selection import load_runs
from scripts.plot_sweep import REFUSED_NOTE, STOPPED_NOTE, main, panel_figure, sweep_lines

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = ["model=tiny", "data=embedded", "train.max_iters=100"]


@pytest.fixture
def sweep(tmp_path, make_run):
    runs = tmp_path / "runs"
    for lr, loss in ((1e-3, 6.3), (3e-3, 6.1), (1e-2, 6.4)):
        make_run(runs / f"adamw-{lr}", [*TINY, "optimizer=adamw", f"optimizer.lr={lr}", f"train.min_lr={lr / 10}"],
                 [10.8, loss], 1024)
    make_run(runs / "adamw-3e-3-seed2", [*TINY, "optimizer=adamw", "optimizer.lr=3e-3", f"train.min_lr={3e-3 / 10}",
                                         "train.seed=2"], [10.8, 6.3], 1024)
    for lr, loss in ((3e-3, 6.2), (1e-2, 6.0)):
        make_run(runs / f"mars-{lr}", [*TINY, "optimizer=mars-adamw", f"optimizer.lr={lr}"], [10.8, loss], 1024)
    for gamma, loss in ((0.0, 6.05), (0.05, 6.1)):
        make_run(runs / f"mars-gamma{gamma}", [*TINY, "optimizer=mars-adamw", "optimizer.lr=1e-2",
                                               f"optimizer.gamma={gamma}"], [10.8, loss], 1024)
    return runs


def test_lr_lines_pool_seeds_and_keep_other_settings_apart(sweep):
    [lines] = sweep_lines(load_runs([str(sweep)]), "lr").values()
    adamw, mars = lines
    assert (adamw.label, adamw.x, adamw.seeds) == ("AdamW", [1e-3, 3e-3, 1e-2], [1, 2, 1])
    assert adamw.mean[1] == pytest.approx(6.2) and (adamw.low[1], adamw.high[1]) == (6.1, 6.3)
    assert (mars.label, mars.x, mars.mean) == ("MARS-approx", [3e-3, 1e-2], [6.2, 6.0])  # gamma 0.025 only


def test_an_lr_line_joins_runs_whose_second_lr_follows_the_swept_one_at_one_ratio(tmp_path, make_run):
    # As the authors' configs (and scripts.small_study): MARS's lr_1d = lr / 2, Muon's AdamW part 0.15 x lr.
    for lr, loss in ((3e-3, 6.2), (1e-2, 6.0), (3e-2, 6.3)):
        make_run(tmp_path / f"mars-{lr}", [*TINY, "optimizer=mars-adamw", f"optimizer.lr={lr}",
                                           f"optimizer.lr_1d={lr / 2}"], [10.8, loss], 1024)
        make_run(tmp_path / f"muon-{lr}", [*TINY, "optimizer=muon", f"optimizer.lr={lr}",
                                           f"optimizer.adamw_lr={0.15 * lr}"], [10.8, loss - 0.5], 1024)
    make_run(tmp_path / "mars-other-ratio", [*TINY, "optimizer=mars-adamw", "optimizer.lr=1e-2",
                                             "optimizer.lr_1d=1e-2"], [10.8, 5.0], 1024)
    [lines] = sweep_lines(load_runs([str(tmp_path)]), "lr").values()
    assert sorted((line.label, tuple(line.x)) for line in lines) == [("MARS-approx", (3e-3, 1e-2, 3e-2)),
                                                                     ("Muon", (3e-3, 1e-2, 3e-2))]


def test_gamma_line_runs_through_the_lr_it_was_swept_at(sweep):
    [[line]] = sweep_lines(load_runs([str(sweep)]), "gamma").values()
    assert (line.x, line.mean) == ([0.0, 0.025, 0.05], [6.05, 6.0, 6.1])


def legend_texts(figure) -> list[str]:
    return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]


@pytest.mark.slow
def test_a_point_with_a_stopped_seed_is_drawn_hollow_and_the_legend_says_why(sweep, make_run, caplog):
    make_run(sweep / "adamw-1e-2-seed2", [*TINY, "optimizer=adamw", "optimizer.lr=1e-2", f"train.min_lr={1e-2 / 10}",
                                          "train.seed=2"], [10.8, 6.6], 1024, eval_steps=[0, 50])
    runs = load_runs([str(sweep)])
    with caplog.at_level(logging.WARNING):
        [lines] = sweep_lines(runs, "lr").values()
    adamw, mars = lines
    assert [[Path(run.name).name for run in point] for point in adamw.stopped] == [[], [], ["adamw-1e-2-seed2"]]
    assert mars.stopped == [[], []]
    assert "adamw-1e-2-seed2 at step 50 of 100" in caplog.text
    figure = panel_figure(lines, "lr", "sweep")
    hollow = [line for line in figure.axes[0].lines
              if line.get_xdata().size and same_color(line.get_markerfacecolor(), "white")]
    assert [(line.get_xdata().tolist(), line.get_ydata().tolist()) for line in hollow] == [([1e-2], [adamw.mean[2]])]
    assert hollow[0].get_zorder() > figure.axes[0].containers[0].lines[0].get_zorder()  # over the filled marker
    assert legend_texts(figure) == ["AdamW", "MARS-approx", STOPPED_NOTE]
    plt.close(figure)
    [[gamma_line]] = sweep_lines(runs, "gamma").values()
    figure = panel_figure([gamma_line], "gamma", "sweep")
    assert legend_texts(figure) == ["MARS-approx"]  # nothing stopped: no hollow points to explain
    plt.close(figure)


@pytest.mark.slow
def test_writes_an_lr_and_a_gamma_figure(sweep, tmp_path, capsys):
    main([str(sweep), "--out", str(tmp_path / "figures")])
    written = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert written == ["gamma_sweep_embedded_4x128_102K.png", "lr_sweep_embedded_4x128_102K.png"]
    assert all((tmp_path / "figures" / name).read_bytes().startswith(PNG_SIGNATURE) for name in written)


def test_nothing_swept_is_an_error(tmp_path, make_run):
    make_run(tmp_path / "one", [*TINY, "optimizer=adamw"], [10.8, 6.3], 1024)
    with pytest.raises(SystemExit, match="nothing to plot"):
        main([str(tmp_path / "one"), "--out", str(tmp_path / "figures")])


def test_lines_of_one_optimizer_are_in_numeric_order_of_the_value_held_fixed(tmp_path, make_run):
    # Best first is 0.025, then 0.05, then 0.005: the order the settings are ranked in, not the legend's.
    for gamma, loss in ((0.025, 6.0), (0.05, 6.1), (0.005, 6.2)):
        for lr in (3e-3, 1e-2):
            make_run(tmp_path / f"mars-{gamma}-{lr}", [*TINY, "optimizer=mars-adamw", f"optimizer.lr={lr}",
                                                      f"optimizer.gamma={gamma}"], [10.8, loss + lr], 1024)
    [lines] = sweep_lines(load_runs([str(tmp_path)]), "lr").values()
    assert [line.label for line in lines] == ["MARS-approx, gamma 0.005", "MARS-approx, gamma 0.025",
                                              "MARS-approx, gamma 0.05"]
    figure = panel_figure(lines, "lr", "sweep")
    assert legend_texts(figure) == [line.label for line in lines]
    plt.close(figure)


def triangles(axes) -> list[tuple[list, list]]:
    return [(drawn.get_xdata().tolist(), drawn.get_ydata().tolist()) for drawn in axes.lines
            if drawn.get_marker() == "^"]


def extent(artist):
    return artist.get_window_extent(artist.figure.canvas.get_renderer())


@pytest.mark.slow
def test_a_diverged_point_is_a_triangle_above_the_axes_and_a_refused_one_is_listed_under_it_not_placed(
        sweep, make_run, make_failure, tmp_path):
    mars = [*TINY, "optimizer=mars-adamw", "optimizer.lr=1e-2"]
    diverged = make_run(sweep / "mars-gamma0.5", [*mars, "optimizer.gamma=0.5"], [10.8], 1024, eval_steps=[0])
    make_failure(diverged, "diverged", "non-finite training loss nan", 3, [*mars, "optimizer.gamma=0.5"])
    make_failure(sweep / "mars-gamma-0.1", "refused", "gamma must be >= 0, got -0.1", 0,
                 [*mars, "optimizer.gamma=-0.1"])
    [[line]] = sweep_lines(load_runs([str(sweep)]), "gamma").values()
    assert (line.x, line.mean) == ([0.0, 0.025, 0.05], [6.05, 6.0, 6.1])  # the failed points have no loss
    assert [(x, run.failure["kind"]) for x, run in line.failed] == [(0.5, "diverged")]
    assert [(x, run.failure["kind"]) for x, run in line.refused] == [(-0.1, "refused")]
    figure = panel_figure([line], "gamma", "sweep")
    axes = figure.axes[0]
    assert triangles(axes) == [([0.5], [FAILED_BAND])]
    triangle = next(drawn for drawn in axes.lines if drawn.get_marker() == "^")
    assert triangle.get_transform() == axes.get_xaxis_transform()  # above the axes' top edge, above every loss
    assert same_color(triangle.get_color(), axes.containers[0].lines[0].get_color())
    assert axes.get_xlim()[0] > -0.05  # the refused -0.1 does not stretch the axis
    assert legend_texts(figure) == ["MARS-approx", "MARS-approx, gamma 0.5: diverged at step 3"]
    assert [text.get_text() for text in axes.texts] == [
        FAILED_NOTE, f"{REFUSED_NOTE}\nMARS-approx, gamma -0.1: gamma must be >= 0, got -0.1"]
    figure.savefig(tmp_path / "gamma_sweep.png")
    plt.close(figure)


def test_failed_points_at_one_value_are_stacked_and_a_line_without_a_healthy_point_has_no_legend_entry(
        tmp_path, make_run, make_failure):
    # Two lines (gamma 0.025 and 0.05) diverge at lr 10; the gamma 0.05 line has no healthy point at all.
    for gamma in (0.025, 0.05):
        mars = [*TINY, "optimizer=mars-adamw", f"optimizer.gamma={gamma}"]
        make_failure(tmp_path / f"mars-{gamma}-10", "diverged", "val loss 981", 20, [*mars, "optimizer.lr=10"])
        make_failure(tmp_path / f"mars-{gamma}-20", "diverged", "val loss 1e4", 20, [*mars, "optimizer.lr=20"])
    for lr, loss in ((1e-3, 6.3), (3e-3, 6.1)):
        make_run(tmp_path / f"mars-{lr}", [*TINY, "optimizer=mars-adamw", f"optimizer.lr={lr}"], [10.8, loss], 1024)
    [lines] = sweep_lines(load_runs([str(tmp_path)]), "lr").values()
    figure = panel_figure(lines, "lr", "sweep")
    axes = figure.axes[0]
    assert sorted(triangles(axes)) == [([10.0], [FAILED_BAND]), ([10.0], [FAILED_BAND + FAILED_SPACING]),
                                       ([20.0], [FAILED_BAND]), ([20.0], [FAILED_BAND + FAILED_SPACING])]
    assert legend_texts(figure)[0] == "MARS-approx, gamma 0.025"
    assert "MARS-approx, gamma 0.05" not in legend_texts(figure)  # no curve: its triangles carry its label
    assert all(text.get_text() for text in figure.axes[0].get_legend().get_texts())
    plt.close(figure)


def test_a_sweep_whose_every_point_failed_writes_no_figure_but_one_line_saying_so(tmp_path, make_failure):
    for lr in (10, 20):
        make_failure(tmp_path / f"mars-{lr}", "diverged", "val loss 981", 20,
                     [*TINY, "optimizer=mars-adamw", f"optimizer.lr={lr}"])
    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path), "--out", str(tmp_path / "figures")])
    assert str(stopped.value) == ("error: every point of the lr sweep of 4x128, Shakespeare (embedded), 102K tokens "
                                  "failed: nothing to plot (scripts.make_table gives each one's reason)")
    assert not (tmp_path / "figures").exists()


def test_figures_that_cannot_be_written_are_one_line_naming_the_file(sweep, tmp_path):
    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "lr_sweep_embedded_4x128_102K.png").symlink_to("/dev/full")  # every write fails with ENOSPC
    with pytest.raises(SystemExit) as stopped:
        main([str(sweep), "--out", str(figures)])
    assert str(stopped.value).startswith("error: cannot write ") and "(No space left on device)" in str(stopped.value)


def test_a_blown_up_point_is_above_the_best_healthy_point_and_the_legend_is_names_no_wider_than_the_axes(
        tmp_path, make_run, make_failure):
    # A sweep of lr 3e-3, 1e-3, 10 at gamma 0.025 whose lr 10 diverged (val loss 986.6) with a long reason.
    mars = [*TINY, "optimizer=mars-adamw"]
    for lr, loss in ((1e-3, 6.9), (3e-3, 6.753)):
        make_run(tmp_path / f"mars-{lr}", [*mars, f"optimizer.lr={lr}"], [10.8, loss], 1024)
    reason = ("val loss 986.6 at step 20, above 10 x the step-0 val loss 10.83: the run diverged; lower optimizer.lr "
              "or raise train.warmup_iters")
    make_failure(tmp_path / "mars-10", "diverged", reason, 20, [*mars, "optimizer.lr=10"])
    [lines] = sweep_lines(load_runs([str(tmp_path)]), "lr").values()
    figure = panel_figure(lines, "lr", "sweep")
    axes = figure.axes[0]
    figure.canvas.draw()
    to_pixels = axes.get_xaxis_transform()
    [(_, [top])] = triangles(axes)
    healthy = axes.containers[0].lines[0]
    lowest_healthy = min(healthy.get_ydata())
    assert top == FAILED_BAND and to_pixels.transform((10, top))[1] > axes.transData.transform((3e-3, lowest_healthy))[1]
    low, high = axes.get_ylim()
    assert low <= lowest_healthy <= high  # the best point is on the axes, the lowest marker drawn
    marker_heights = [axes.transData.transform((0, y))[1] for y in healthy.get_ydata()]
    assert min(marker_heights) == axes.transData.transform((0, 6.753))[1]
    assert legend_texts(figure) == ["MARS-approx", "MARS-approx, lr 10: diverged at step 20"]
    assert extent(axes.get_legend()).width <= extent(axes).width
    plt.close(figure)


def test_a_refused_points_long_reason_under_the_axes_is_no_wider_than_them(sweep, make_failure):
    make_failure(sweep / "mars-gamma-0.1", "refused", "optimizer.gamma must be >= 0, got -0.1: set it to 0 (no "
                 "variance reduction: plain AdamW) or to a small positive value such as the paper's 0.025", 0,
                 [*TINY, "optimizer=mars-adamw", "optimizer.lr=1e-2", "optimizer.gamma=-0.1"])
    [[line]] = sweep_lines(load_runs([str(sweep)]), "gamma").values()
    figure = panel_figure([line], "gamma", "sweep")
    figure.canvas.draw()
    [note] = figure.axes[0].texts
    assert note.get_text().startswith(f"{REFUSED_NOTE}\nMARS-approx, gamma -0.1: optimizer.gamma must be >= 0")
    assert extent(note).width <= extent(figure.axes[0]).width
    plt.close(figure)


def test_failed_points_of_three_optimizers_at_one_lr_lie_above_the_axes_where_no_value_reaches(
        tmp_path, make_run, make_failure):
    # AdamW, Muon and MARS each diverged at lr 10, MARS's healthy lr 1e-3 point the highest loss drawn: the three
    # triangles stack in the band above the axes' top edge, under the title, never among the values.
    for optimizer, losses in (("adamw", (6.5, 6.3)), ("muon", (6.6, 6.2)), ("mars-adamw", (6.946, 6.5))):
        for lr, loss in zip((1e-3, 3e-3), losses):
            make_run(tmp_path / f"{optimizer}-{lr}", [*TINY, f"optimizer={optimizer}", f"optimizer.lr={lr}"],
                     [10.8, loss], 1024)
        make_failure(tmp_path / f"{optimizer}-10", "diverged", "val loss 981", 20,
                     [*TINY, f"optimizer={optimizer}", "optimizer.lr=10"])
    [lines] = sweep_lines(load_runs([str(tmp_path)]), "lr").values()
    figure = panel_figure(lines, "lr", "sweep")
    axes = figure.axes[0]
    figure.canvas.draw()
    top_edge = extent(axes).y1
    heights = sorted(axes.get_xaxis_transform().transform((10, y))[1] for _, [y] in triangles(axes))
    assert len(heights) == 3 and heights[0] > top_edge, (heights, top_edge)
    assert len(set(heights)) == 3  # stacked, one over another
    assert extent(axes.title).y0 > heights[-1]  # the title clears the band
    assert axes.get_ylim()[1] >= 6.946  # every healthy point on the axes
    band_label, = [text for text in axes.texts if text.get_text() == FAILED_NOTE]
    assert extent(band_label).y0 > top_edge
    plt.close(figure)
