"""Validation-loss curves against tokens and training time: one pair of PNG files per corpus and model size."""
import logging
import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.colors import rgb_to_hsv, same_color, to_rgb

import scripts.plot_curves as plot_curves_module
from reporting.failure_band import FAILED_BAND, FAILED_NOTE
from reporting.run_reading import Run
from reporting.run_selection import Setting, load_runs
from scripts.plot_curves import (curve_label, every_point_lines, group_figure, main, plot_curves, seed_curves,
                                 training_seconds)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_one_figure_per_model_size_against_tokens_and_against_time(paper_runs, make_run, tmp_path):
    make_run(paper_runs / "medium", ["experiment=owt-gpt2-medium-5b-muon"], [10.9, 3.3, 3.01], tokens_per_step=491_520)
    written = plot_curves(load_runs([str(paper_runs)]), tmp_path / "curves")
    assert sorted(path.name for path in written) == [
        "val_loss_vs_time_openwebtext_medium.png", "val_loss_vs_time_openwebtext_small.png",
        "val_loss_vs_tokens_openwebtext_medium.png", "val_loss_vs_tokens_openwebtext_small.png"]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def test_each_optimizer_is_drawn_from_its_best_setting(paper_runs, tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plot_curves_module, "plot_group", lambda lines, *args, **kwargs: drawn.append(lines))
    plot_curves(load_runs([str(paper_runs)]), tmp_path)
    lines = drawn[0]
    # MARS ran with two gammas: the line says which it drew; AdamW's seeds are one setting, nothing to say.
    assert [label for label, _ in lines] == ["AdamW", "MARS-approx (gamma=0.025, best of 2 settings)"]
    assert len(lines[0][1].runs) == 2 and lines[1][1].first.gamma == 0.025


def test_a_line_cut_short_by_a_stopped_seed_says_which_and_where(paper_runs, make_run, tmp_path, monkeypatch,
                                                                  caplog):
    make_run(paper_runs / "adamw-seed3", ["experiment=owt-gpt2-small-5b-adamw", "train.seed=3"], [10.9, 3.6],
             tokens_per_step=491_520, eval_steps=[0, 5000])
    drawn = []
    monkeypatch.setattr(plot_curves_module, "plot_group", lambda lines, *args, **kwargs: drawn.append(lines))
    with caplog.at_level(logging.WARNING):
        plot_curves(load_runs([str(paper_runs)]), tmp_path)
    figure = group_figure(drawn[0], "tokens", "GPT-2 small")
    axes = figure.axes[0]
    assert [text.get_text() for text in axes.get_legend().get_texts()] == [
        "AdamW (3 seeds; stopped: adamw-seed3 at step 5,000 of 10,000)",
        "MARS-approx (gamma=0.025, best of 2 settings)"]
    assert axes.lines[0].get_xdata()[-1] == pytest.approx(5000 * 491_520 / 1e9)  # where the stopped seed ends
    plt.close(figure)
    # Once per run, not per figure: the tokens and the time figure draw the same line.
    assert caplog.text.count("adamw-seed3 stopped at step 5,000 of 10,000") == 1


def test_a_stopped_single_run_is_not_labelled_as_a_finished_short_one(make_run, tmp_path):
    make_run(tmp_path / "preempted", ["train.max_iters=200"], [10.8, 7.5, 6.8], tokens_per_step=1024,
             eval_steps=[0, 50, 100])
    make_run(tmp_path / "finished", ["train.max_iters=100"], [10.8, 7.5, 6.8], tokens_per_step=1024)
    preempted, finished = load_runs([str(tmp_path)])[::-1]
    assert curve_label("AdamW", Setting([preempted])) == "AdamW (stopped: preempted at step 100 of 200)"
    assert curve_label("AdamW", Setting([finished])) == "AdamW"


def y_limits_of(runs, tmp_path, monkeypatch):
    limits = []
    real_subplots = plot_curves_module.plt.subplots

    def recording_subplots(*args, **kwargs):
        figure, axes = real_subplots(*args, **kwargs)
        original = axes.set_ylim
        axes.set_ylim = lambda *limit, **options: (limits.append(limit), original(*limit, **options))[1]
        return figure, axes

    monkeypatch.setattr(plot_curves_module.plt, "subplots", recording_subplots)
    plot_curves(runs, tmp_path)
    return limits[0]


def test_short_runs_are_drawn_from_their_first_evaluation(make_run, tmp_path, monkeypatch):
    make_run(tmp_path / "short", ["train.max_iters=200"], [10.8, 7.5, 6.8, 6.5, 6.3], tokens_per_step=1024)
    low, high = y_limits_of(load_runs([str(tmp_path / "short")]), tmp_path / "out", monkeypatch)
    assert low < 6.3 and high > 10.8


def test_long_runs_are_zoomed_to_a_unit_above_the_best_loss(make_run, tmp_path, monkeypatch):
    losses = [10.9] + list(np.linspace(4.0, 3.0, plot_curves_module.ZOOM_EVALUATIONS))
    make_run(tmp_path / "long", ["train.max_iters=2000"], losses, tokens_per_step=1024)
    low, high = y_limits_of(load_runs([str(tmp_path / "long")]), tmp_path / "out", monkeypatch)
    assert low == pytest.approx(2.95) and high == pytest.approx(4.05)


def test_seeds_are_aligned_at_the_evaluations_they_share(paper_runs):
    runs = [run for run in load_runs([str(paper_runs)]) if run.optimizer == "adamw"]
    runs[1].records = [r for r in runs[1].records if r["step"] != 5000]
    steps, tokens, seconds, losses = seed_curves(Setting(runs))
    assert steps.tolist() == [0, 10000]
    np.testing.assert_allclose(losses, [[10.9, 3.201], [10.9, 3.205]])
    np.testing.assert_allclose(tokens[0], [0, 10000 * 491_520])
    np.testing.assert_allclose(seconds, [[0, 1000.0], [0, 1200.0]])  # 10,000 steps of 100 ms and of 120 ms


def test_training_time_adds_up_the_logged_step_times():
    run = Run(name="r", corpus="c", model="m", optimizer="o", budget=0, setting="s",
              records=[{"step": 10, "step_ms": 100.0}, {"step": 10, "val/loss": 3.0}, {"step": 20, "step_ms": 200.0}])
    assert training_seconds(run, np.array([0, 10, 15, 20])).tolist() == pytest.approx([0.0, 1.0, 2.0, 3.0])


def test_cli_writes_the_figures_and_names_them(paper_runs, tmp_path, capsys):
    main([str(paper_runs), "--out", str(tmp_path / "figures")])
    printed = capsys.readouterr().out.split()
    assert len(printed) == 2 and all((tmp_path / "figures" / name.rsplit("/", 1)[-1]).is_file() for name in printed)


TINY = ["model=tiny", "data=embedded", "train.max_iters=100"]


@pytest.fixture
def gamma_sweep(tmp_path, make_run, make_failure) -> Path:
    """AdamW, and MARS at five gammas: three fine (ranked 0.025, 0.05, 0.005 by loss), one diverged at step 60,
    one refused."""
    sweep = tmp_path / "sweep"
    make_run(sweep / "adamw", [*TINY, "optimizer=adamw"], [10.8, 7.0, 6.4], 1024)
    mars = [*TINY, "optimizer=mars-adamw"]
    for gamma, loss in ((0.025, 6.0), (0.05, 6.1), (0.005, 6.2)):
        make_run(sweep / f"mars-gamma={gamma}", [*mars, f"optimizer.gamma={gamma}"], [10.8, 7.0, loss], 1024)
    diverged = make_run(sweep / "mars-gamma=0.5", [*mars, "optimizer.gamma=0.5"], [10.8, 8.0], 1024,
                        eval_steps=[0, 50])
    make_failure(diverged, "diverged", "the loss is nan at step 61", 60, [*mars, "optimizer.gamma=0.5"])
    make_failure(sweep / "mars-gamma=-0.1", "refused", "optimizer.gamma must be >= 0", 0,
                 [*mars, "optimizer.gamma=-0.1"])
    return sweep


def test_every_point_draws_a_line_per_setting_labelled_by_the_swept_value_in_numeric_order(gamma_sweep, tmp_path,
                                                                                          monkeypatch):
    drawn = []
    monkeypatch.setattr(plot_curves_module, "plot_group", lambda lines, *args, **kwargs: drawn.append(lines))
    plot_curves(load_runs([str(gamma_sweep)]), tmp_path / "curves", every_point=True)
    lines = drawn[0]
    figure = group_figure(lines, "tokens", "every point")
    axes = figure.axes[0]
    # The refused point draws nothing: no legend entry, listed under the axes.
    assert [text.get_text() for text in axes.get_legend().get_texts()] == [
        "AdamW", "MARS-approx, gamma=0.005", "MARS-approx, gamma=0.025", "MARS-approx, gamma=0.05",
        "MARS-approx, gamma=0.5 (diverged at step 60)"]
    assert [text.get_text() for text in axes.texts] == [
        f"{plot_curves_module.NOT_DRAWN_NOTE}\nMARS-approx, gamma=-0.1 (refused; no evaluation)", FAILED_NOTE]
    # The failed point: dashed to its last evaluation, and a cross in the band above the axes at its failure's step.
    styles = [(line.get_linestyle(), line.get_marker(), line.get_xdata().size) for line in axes.lines]
    assert styles == [("-", "None", 3), ("-", "None", 3), ("-", "None", 3), ("-", "None", 3), ("--", "None", 2),
                      ("None", "x", 1)]
    cross = axes.lines[-1]
    assert cross.get_transform() == axes.get_xaxis_transform() and cross.get_ydata().tolist() == [FAILED_BAND]
    failed = next(setting for label, setting in lines if setting.failed)
    assert cross.get_xdata().tolist() == [60 * failed.first.budget / failed.first.max_iters / 1e3]  # step 60, in K
    assert same_color(cross.get_color(), axes.lines[-2].get_color())
    plt.close(figure)


def test_a_point_that_failed_before_its_first_evaluation_is_a_cross_above_the_axes_where_it_failed(
        make_run, make_failure, tmp_path):
    # Diverged at step 30 with the step-0 evaluation alone: its mark is at 30 steps' tokens above the axes, not a
    # cross at 0 tokens under the start of every line.
    mars = [*TINY, "optimizer=mars-adamw"]
    for gamma, loss in ((0.005, 6.1), (0.025, 6.0)):
        make_run(tmp_path / f"mars-{gamma}", [*mars, f"optimizer.gamma={gamma}"], [10.8, loss], 1024)
    early = make_run(tmp_path / "mars-0.5", [*mars, "optimizer.gamma=0.5"], [10.8], 1024, eval_steps=[0])
    make_failure(early, "diverged", "the loss is nan at step 31", 30, [*mars, "optimizer.gamma=0.5"])
    [lines] = every_point_lines(load_runs([str(tmp_path)])).values()
    for x_axis in ("tokens", "time"):
        figure = group_figure(lines, x_axis, "every point")
        axes = figure.axes[0]
        figure.canvas.draw()
        [cross] = [line for line in axes.lines if line.get_marker() == "x"]
        renderer = figure.canvas.get_renderer()
        height = axes.get_xaxis_transform().transform((0, cross.get_ydata()[0]))[1]
        assert height > axes.get_window_extent(renderer).y1  # above the axes, where no line runs
        if x_axis == "tokens":  # at step 30, not at 0 with the step-0 evaluation (it logged no step time)
            assert cross.get_xdata().tolist() == [30 * 1024 / 1000]  # tokens of 30 steps, in thousands
        assert FAILED_NOTE in [text.get_text() for text in axes.texts]
        plt.close(figure)


def test_every_point_gives_each_optimizer_a_hue_and_its_settings_shades_of_it(gamma_sweep, tmp_path):
    [lines] = every_point_lines(load_runs([str(gamma_sweep)])).values()
    colors = plot_curves_module.optimizer_shades(lines)
    optimizers = [setting.first.optimizer for _, setting in lines]
    hues = {optimizer: [rgb_to_hsv(to_rgb(color))[0] for color, other in zip(colors, optimizers) if other == optimizer]
            for optimizer in set(optimizers)}
    assert all(max(each) - min(each) < 0.05 for each in hues.values()), hues  # one hue an optimizer
    (first, *_), (second, *_) = hues.values()
    assert abs(first - second) > 0.2, hues  # each its own
    mars = [to_rgb(color) for color, optimizer in zip(colors, optimizers) if optimizer == "mars-approx"]
    assert len(set(mars)) == len(mars) > 1  # a shade a setting


@pytest.mark.parametrize("every_point", [False, True])
def test_runs_whose_every_loss_is_nan_are_listed_under_the_axes_and_the_healthy_ones_drawn(make_run, tmp_path,
                                                                                           monkeypatch, every_point):
    # AdamW first in the figure, its only run evaluated in float16, which overflowed: every val loss NaN.
    make_run(tmp_path / "runs" / "adamw-fp16", [*TINY, "optimizer=adamw", "train.dtype=float16"],
             [math.nan, math.nan, math.nan], 1024)
    make_run(tmp_path / "runs" / "mars", [*TINY, "optimizer=mars-adamw"], [10.8, 7.0, 6.4], 1024)
    drawn = []
    monkeypatch.setattr(plot_curves_module, "plot_group", lambda lines, *args, **kwargs: drawn.append(lines))
    plot_curves(load_runs([str(tmp_path / "runs")]), tmp_path / "curves", every_point=every_point)
    figure = group_figure(drawn[0], "tokens", "fp16")
    axes = figure.axes[0]
    assert [text.get_text() for text in axes.get_legend().get_texts()] == ["MARS-approx"]
    assert [line.get_ydata().tolist() for line in axes.lines] == [[10.8, 7.0, 6.4]]
    low, high = axes.get_ylim()
    assert 6.3 < low < 6.4 and 10.8 < high < 10.9
    assert [text.get_text() for text in axes.texts] == [
        f"{plot_curves_module.NOT_DRAWN_NOTE}\nAdamW (every val loss NaN: adamw-fp16 at 3 evaluations)"]
    plt.close(figure)


def test_the_cli_draws_beside_runs_whose_every_loss_is_nan(make_run, tmp_path, capsys):
    make_run(tmp_path / "runs" / "adamw-fp16", [*TINY, "optimizer=adamw"], [math.nan, math.nan], 1024)
    make_run(tmp_path / "runs" / "mars", [*TINY, "optimizer=mars-adamw"], [10.8, 6.4], 1024)
    main([str(tmp_path / "runs"), "--out", str(tmp_path / "figures")])
    assert len(capsys.readouterr().out.split()) == 2


def test_cli_every_point_writes_figures_of_their_own(gamma_sweep, tmp_path, capsys):
    main([str(gamma_sweep), "--out", str(tmp_path / "figures"), "--every-point"])
    printed = sorted(Path(name).name for name in capsys.readouterr().out.split())
    assert printed == ["val_loss_vs_time_embedded_4x128_every_point.png",
                       "val_loss_vs_tokens_embedded_4x128_every_point.png"]
    assert all((tmp_path / "figures" / name).read_bytes().startswith(PNG_SIGNATURE) for name in printed)


def test_a_run_that_blew_up_leaves_the_frame_as_triangles_and_the_healthy_curves_keep_their_range(
        gamma_sweep, make_run, make_failure, tmp_path, monkeypatch):
    mars = [*TINY, "optimizer=mars-adamw", "optimizer.lr=10"]
    blown = make_run(gamma_sweep / "mars-lr=10", mars, [10.8, 981.0, 757.0], 1024)
    make_failure(blown, "diverged", "val loss 981, above 1 x the step-0 val loss 10.8", 50, mars)
    nan = [*mars[:-1], "optimizer.lr=1e8"]
    make_failure(make_run(gamma_sweep / "mars-lr=1e8", nan, [10.8, math.nan], 1024, eval_steps=[0, 50]),
                 "diverged", "non-finite val loss nan", 50, nan)
    drawn = []
    monkeypatch.setattr(plot_curves_module, "plot_group", lambda lines, *args, **kwargs: drawn.append(lines))
    plot_curves(load_runs([str(gamma_sweep)]), tmp_path / "curves", every_point=True)
    figure = group_figure(drawn[0], "tokens", "every point")
    axes = figure.axes[0]
    low, high = axes.get_ylim()
    assert low < 6.0 and 10.8 < high < 11.0  # what the healthy runs span, from their best to step 0
    triangles = [line for line in axes.lines if line.get_marker() == "^"]
    # On the top edge; the NaN one at step 50 below the other's there, not hidden behind it.
    assert [(line.get_xdata().tolist(), line.get_ydata().tolist()) for line in triangles] == [
        (pytest.approx([50 * 1024 / 1e3, 100 * 1024 / 1e3]), [1.0, 1.0]),
        (pytest.approx([50 * 1024 / 1e3]), [1.0 - plot_curves_module.TRIANGLE_SPACING])]
    assert all(line.get_transform() == axes.get_xaxis_transform() for line in triangles)
    assert [text.get_text() for text in axes.texts] == [
        f"{plot_curves_module.CLIPPED_NOTE} (up to 981)\n{plot_curves_module.NOT_DRAWN_NOTE}\n"
        "MARS-approx, gamma=-0.1, lr=0.003 (refused; no evaluation)", FAILED_NOTE]
    plt.close(figure)


@pytest.mark.parametrize("slower_ms, told", [(180.0, True), (110.0, False)])
def test_a_time_figure_says_when_runs_of_the_same_work_ran_at_visibly_other_speeds(make_run, tmp_path, caplog,
                                                                                   slower_ms, told):
    # Two seeds of one AdamW setting, the same work per step: one at 100 ms a step, the other at 180 (a machine
    # under another load: 1.8x) or at 110 (1.1x, within what an idle machine varies). MARS beside them, at its own
    # speed, is no spread: another optimizer's work.
    adamw = [*TINY, "optimizer=adamw"]
    make_run(tmp_path / "adamw-seed1", adamw, [10.8, 7.0, 6.5], 1024, step_ms=100.0)
    make_run(tmp_path / "adamw-seed2", [*adamw, "train.seed=2"], [10.8, 7.1, 6.4], 1024, step_ms=slower_ms)
    make_run(tmp_path / "mars", [*TINY, "optimizer=mars-adamw"], [10.8, 6.9, 6.3], 1024, step_ms=300.0)
    lines = [(label, setting) for label, setting in every_point_lines(load_runs([str(tmp_path)])).popitem()[1]]
    with caplog.at_level(logging.WARNING):
        figure = group_figure(lines, "time", "time")
    notes = "\n".join(text.get_text() for text in figure.axes[0].texts)
    plt.close(figure)
    spread = "AdamW 5,689-10,240 tokens/s (2 runs)"  # 1024 tokens a step at 180 and at 100 ms
    assert (plot_curves_module.SPEED_NOTE in notes and spread in notes) is told, notes
    assert (spread in caplog.text) is told
    assert "MARS" not in notes
    figure = group_figure(lines, "tokens", "tokens")  # the tokens axis is no measure of speed
    assert plot_curves_module.SPEED_NOTE not in "\n".join(text.get_text() for text in figure.axes[0].texts)
    plt.close(figure)
