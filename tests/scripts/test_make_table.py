"""The markdown table: our best validation loss beside the paper's, in the paper's layout, and every setting."""
import csv
import json
import logging
import math
import os
import shlex
import statistics
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from reporting.run_labels import count_label
from reporting.run_selection import load_runs
from reporting.target_loss import Reached, duration_label, reached
from scripts.make_table import LITERATURE_PERPLEXITY, PAPER_VAL_LOSS, load_wandb_csv, main, make_table
from tests.configs.test_experiments import load

REPOSITORY = Path(__file__).resolve().parents[2]
TOKENS_PER_STEP = 491_520
# A 50B run evaluated past the ends of its first 5B and 20B tokens (steps 10,000 and 40,000, where the 5B and
# 20B presets stop) and just after them: step 10,100 has 4.96e9 tokens, fewer than 5e9, but the 5B preset never
# gets there.
LONG_RUN_STEPS = [0, 5_000, 10_000, 10_100, 40_000, 40_100, 100_000]


def table_rows(table: str, heading: str) -> dict[str, list[str]]:
    """The rows of the table under ``heading``, by their first cell."""
    lines = table.split(heading, 1)[1].split("\n\n", 2)[1].splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    return {row[0]: row[1:] for row in cells}


def test_paper_layout_has_our_best_loss_beside_the_papers(paper_runs):
    table = make_table(load_runs([str(paper_runs)]))
    rows = table_rows(table, "### OpenWebText: best validation loss")
    assert rows["optimizer"] == ["GPT-2 small, 5B tokens"]
    assert rows["AdamW"] == ["3.203 / 3.193 (+0.010)"]  # the mean of the two seeds' best
    assert rows["MARS-approx"] == ["3.110 / 3.108 (+0.002)"]  # the better of the two gammas
    assert rows["Muon"] == ["– / 3.165"] and rows["MARS-exact"] == ["– / 3.107"]


def test_every_setting_is_listed_with_its_seeds(paper_runs):
    table = make_table(load_runs([str(paper_runs)]))
    lines = [line for line in table.splitlines() if line.startswith("| OpenWebText | GPT-2 small | 5B |")]
    assert len(lines) == 3
    adamw, best_mars, other_mars = ([cell.strip() for cell in line.strip("|").split("|")] for line in lines)
    assert adamw[3:11] == ["AdamW", "0.0006", "–", "–", "2", "3.203", "3.203", "0.003"]
    assert best_mars[3:9] == ["MARS-approx", "0.006", "0.025", "lr_1d 0.003", "1", "3.110"]
    assert other_mars[5] == "0.05" and other_mars[8] == "3.120"
    assert "Paper numbers: Yuan et al." in table


def test_runs_on_other_corpora_and_budgets_get_their_own_table_without_paper_numbers(paper_runs, make_run):
    make_run(paper_runs / "tiny", ["optimizer=adamw", "train.max_iters=10"], [10.9, 7.5, 6.25], tokens_per_step=1024)
    table = make_table(load_runs([str(paper_runs)]))
    rows = table_rows(table, "### Shakespeare (embedded): best validation loss")
    assert rows["optimizer"] == ["4x128, 10.2K tokens"] and rows["AdamW"] == ["6.250"]


def test_wandb_chart_exports_count_as_runs_of_the_preset_they_are_named_after(paper_runs, tmp_path):
    path = tmp_path / "val_loss.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Step", "owt-gpt2-small-5b-muon - val/loss", "owt-gpt2-small-5b-muon - val/loss__MIN",
                         "owt-gpt2-small-5b-muon - val/loss__MAX", "my-debug-run - val/loss"])
        writer.writerow([0, 10.9, 10.9, 10.9, 11.0])
        writer.writerow([5000, 3.5, 3.5, 3.5, ""])
        writer.writerow([10000, 3.170, 3.170, 3.170, 2.0])
    runs = load_wandb_csv(path)
    assert [(run.optimizer, run.budget, run.best_val_loss) for run in runs] == [("muon", 5e9, 3.170)]
    rows = table_rows(make_table(load_runs([str(paper_runs)]) + runs), "### OpenWebText: best validation loss")
    assert rows["Muon"] == ["3.170 / 3.165 (+0.005)"]


def test_within_run_bests_stop_where_the_shorter_preset_stops(tmp_path, make_run):
    make_run(tmp_path / "adamw-50b", ["experiment=owt-gpt2-small-50b-adamw"],
             [10.9, 3.5, 3.30, 3.29, 3.05, 3.04, 2.90], TOKENS_PER_STEP, eval_steps=LONG_RUN_STEPS)
    run, = load_runs([str(tmp_path)])
    assert (run.prefix_steps(5e9), run.prefix_steps(20e9)) == (10_000, 40_000)
    assert (run.best_val_loss_within(5e9), run.best_val_loss_within(20e9), run.best_val_loss) == (3.30, 3.05, 2.90)
    rows = table_rows(make_table([run]), "### OpenWebText: best validation loss")
    assert rows["optimizer"] == ["GPT-2 small, 5B tokens", "GPT-2 small, 20B tokens", "GPT-2 small, 50B tokens"]
    assert rows["AdamW"] == ["– / 3.193", "– / 3.024", "2.900 / 2.885 (+0.015)"]
    assert rows["AdamW, within 50B run"] == ["3.300 / 3.193 (+0.107)", "3.050 / 3.024 (+0.026)", ""]


def test_separate_and_within_run_figures_of_one_optimizer_stand_in_rows_of_their_own(paper_runs, make_run):
    mars = ["experiment=owt-gpt2-small-50b-mars-approx"]
    make_run(paper_runs / "mars-50b-seed1", mars, [10.9, 3.4, 3.25, 3.2, 3.00, 2.99, 2.84], TOKENS_PER_STEP,
             eval_steps=LONG_RUN_STEPS)
    make_run(paper_runs / "mars-50b-seed2", [*mars, "train.seed=2"], [10.9, 3.4, 3.27, 3.2, 3.02, 2.99, 2.86],
             TOKENS_PER_STEP, eval_steps=LONG_RUN_STEPS)
    table = make_table(load_runs([str(paper_runs)]))
    rows = table_rows(table, "### OpenWebText: best validation loss")
    assert rows["MARS-approx"] == ["3.110 / 3.108 (+0.002)", "– / 2.981", "2.850 / 2.849 (+0.001)"]  # separate runs
    assert rows["MARS-approx, within 50B run"] == ["3.260 / 3.108 (+0.152)", "3.010 / 2.981 (+0.029)", ""]
    assert rows["AdamW"][0] == "3.203 / 3.193 (+0.010)" and "AdamW, within 50B run" not in rows
    legend = table.split("### OpenWebText", 1)[1].split("\n\n")[2]
    assert "optimizer alone: separate runs" in legend and "<optimizer>, within <L> run" in legend
    assert "paper's 5B and 20B columns are most likely of the within-run kind" in legend
    long_setting = next(line for line in table.splitlines() if line.startswith("| OpenWebText | GPT-2 small | 50B |"))
    assert "| 5B: 3.260, 20B: 3.010 |" in long_setting


def test_a_run_not_yet_past_a_budget_gives_no_within_run_figure_for_it(tmp_path, make_run):
    make_run(tmp_path / "adamw-50b", ["experiment=owt-gpt2-small-50b-adamw"], [10.9, 3.30, 3.10], TOKENS_PER_STEP,
             eval_steps=[0, 10_000, 30_000])  # still running: 20B ends at step 40,000
    rows = table_rows(make_table(load_runs([str(tmp_path)])), "### OpenWebText: best validation loss")
    assert rows["optimizer"] == ["GPT-2 small, 5B tokens", "GPT-2 small, 50B tokens"]
    assert rows["AdamW, within 50B run"] == ["3.300 / 3.193 (+0.107)", ""]


def test_a_wandb_export_of_a_long_preset_gives_within_run_figures_at_the_presets_steps(tmp_path):
    path = tmp_path / "val_loss.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Step", "owt-gpt2-small-50b-muon - val/loss"])
        writer.writerows([[0, 10.9], [10_000, 3.30], [10_100, 3.29], [40_000, 3.05], [100_000, 2.90]])
    rows = table_rows(make_table(load_wandb_csv(path)), "### OpenWebText: best validation loss")
    assert rows["Muon, within 50B run"] == ["3.300 / 3.165 (+0.135)", "3.050 / 3.006 (+0.044)", ""]


def test_cli_writes_the_table_beside_the_runs_by_default_and_says_where(paper_runs, tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    main([str(paper_runs / "*")])
    out = paper_runs / "val_loss_table.md"
    assert "3.203 / 3.193 (+0.010)" in out.read_text() and f"wrote {out}" in caplog.text
    assert not out.resolve().is_relative_to(REPOSITORY / "results") and not (tmp_path / "results").exists()


def test_cli_prints_and_writes_the_table_with_its_command(paper_runs, tmp_path, capsys):
    out = tmp_path / "table.md"
    main([str(paper_runs / "*"), "--out", str(out)])
    printed = capsys.readouterr().out
    assert "3.203 / 3.193 (+0.010)" in printed
    written = out.read_text()
    assert written.startswith("<!-- python -m scripts.make_table ") and printed.strip() in written


def test_paper_numbers_are_the_published_table():
    assert len(PAPER_VAL_LOSS) == 9 and sum(len(row) for row in PAPER_VAL_LOSS.values()) == 30
    assert PAPER_VAL_LOSS["openwebtext", "large", 50e9] == {"adamw": 2.561, "muon": 2.573, "mars-approx": 2.518}


def test_a_run_stopped_before_its_configured_steps_is_marked_with_where_it_stopped(paper_runs, make_run):
    make_run(paper_runs / "adamw-seed3", ["experiment=owt-gpt2-small-5b-adamw", "train.seed=3"], [10.9, 3.5],
             TOKENS_PER_STEP, eval_steps=[0, 5_000])  # preempted at step 5,000 and never resumed
    table = make_table(load_runs([str(paper_runs)]))
    rows = table_rows(table, "### OpenWebText: best validation loss")
    assert rows["AdamW"] == ["3.302* / 3.193 (+0.109)"] and rows["MARS-approx"] == ["3.110 / 3.108 (+0.002)"]
    legend = table.split("### OpenWebText", 1)[1].split("\n\n")[2]
    assert "marked * include runs that stopped before their configured steps" in legend
    assert "adamw-seed3 at step 5,000 of 10,000" in legend
    adamw = next(line for line in table.splitlines() if line.startswith("| OpenWebText | GPT-2 small | 5B | AdamW"))
    cells = [cell.strip() for cell in adamw.strip("|").split("|")]
    assert cells[7:9] == ["3", "3.302*"]
    assert cells[-2] == "adamw-seed1, adamw-seed2, adamw-seed3 (stopped at step 5,000 of 10,000)"


def record_launch(run_dir: Path, step: int, commit: str | None, patch: str | None = None) -> None:
    """A launch record as train.py writes it, for the fields the table reads."""
    launch = {"commit": commit, "patch": patch, "untracked": [], "untracked_count": 0}
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "launch": launch}) + "\n")


def test_the_code_column_names_the_commits_each_setting_ran_and_says_when_they_differ(paper_runs):
    record_launch(paper_runs / "adamw-seed1", 0, "a" * 40)
    record_launch(paper_runs / "adamw-seed2", 0, "a" * 40)
    record_launch(paper_runs / "adamw-seed2", 5_000, "b" * 40, patch="code/launch_00005000.patch")  # resumed
    record_launch(paper_runs / "mars-gamma0.025", 0, None)  # outside a git checkout
    table = make_table(load_runs([str(paper_runs)]))
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| OpenWebText | GPT-2 small | 5B")]
    code = {(cells[3], cells[5]): cells[-1] for cells in rows}  # (optimizer, gamma): code
    assert code == {("AdamW", "–"): "aaaaaaa, bbbbbbb+", ("MARS-approx", "0.025"): "unknown",
                    ("MARS-approx", "0.05"): "–"}
    assert "Settings with more than one code version" in table

    for run in ("adamw-seed2", "mars-gamma0.025"):
        lines = (paper_runs / run / "metrics.jsonl").read_text().splitlines()
        (paper_runs / run / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines if "launch" not in line))
    assert "Settings with more than one code version" not in make_table(load_runs([str(paper_runs)]))


def test_custom_corpora_get_a_table_each_named_after_their_directory(tmp_path, make_run):
    base = ["optimizer=adamw", "train.max_iters=10", "data=custom"]
    make_run(tmp_path / "a", [*base, "data.dir=/data/a/shards"], [10.9, 6.0], tokens_per_step=1024)
    make_run(tmp_path / "b", [*base, "data.dir=/data/b/shards"], [10.9, 5.0], tokens_per_step=1024)
    table = make_table(load_runs([str(tmp_path)]))
    assert table_rows(table, "### custom-a-shards: best validation loss")["AdamW"] == ["6.000"]
    assert table_rows(table, "### custom-b-shards: best validation loss")["AdamW"] == ["5.000"]


@pytest.mark.slow
def test_every_setting_shows_its_best_on_fixed_windows_beside_the_papers_procedure(paper_runs, make_run):
    # The presets evaluate on fresh windows (the paper's figure) and score the fixed ones beside them.
    log = paper_runs / "adamw-seed1" / "metrics.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    log.write_text("".join(json.dumps({**r, "val/loss_fixed": r["val/loss"] + 0.010} if "val/loss" in r else r) + "\n"
                           for r in records))
    make_run(paper_runs / "tiny", ["optimizer=adamw", "train.max_iters=10"], [10.9, 7.5, 6.25], tokens_per_step=1024)
    table = make_table(load_runs([str(paper_runs)]))
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith(("| OpenWebText | GPT-2 small | 5B | AdamW",
                                                                 "| Shakespeare (embedded) |"))}
    # Mean of the seeds' best, then the fixed windows': seed 2 logged no fixed-window figure, only seed 1 counts.
    assert rows["OpenWebText"][8:12] == ["3.203", "3.203", "0.003", "3.211"]
    # A run evaluated on fixed windows: its best is the fixed-window figure.
    assert rows["Shakespeare (embedded)"][8] == rows["Shakespeare (embedded)"][11] == "6.250"
    assert "fixed windows: the best on the same windows at every evaluation" in table


TINY = ["model=tiny", "data=embedded", "train.max_iters=100"]


def setting_rows(table: str) -> list[list[str]]:
    """The rows of the table of every setting for the tiny model on the embedded corpus, as cells."""
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| Shakespeare (embedded) | 4x128 |") and "### Tokens" not in line]


def test_failed_sweep_points_have_rows_of_their_own_with_their_reason(tmp_path, make_run, make_failure):
    sweep = tmp_path / "sweep"
    mars = [*TINY, "optimizer=mars-adamw"]
    make_run(sweep / "0_gamma=0.025", [*mars, "optimizer.gamma=0.025"], [10.8, 6.0], 1024)
    # A second seed of that setting that diverged after reaching a lower loss: never averaged with the first.
    seed2 = make_run(sweep / "1_gamma=0.025,seed=2", [*mars, "optimizer.gamma=0.025", "train.seed=2"], [10.8, 5.0],
                     1024, eval_steps=[0, 50])
    make_failure(seed2, "diverged", "the loss is nan at step 61", 60, [*mars, "optimizer.gamma=0.025", "train.seed=2"])
    # Diverged before its first log line: the evaluation at step 0 only.
    early = make_run(sweep / "2_gamma=0.5", [*mars, "optimizer.gamma=0.5"], [10.8], 1024, eval_steps=[0])
    make_failure(early, "diverged", "the loss is inf at step 1", 0, [*mars, "optimizer.gamma=0.5"])
    # Refused at validation: failure.json alone.
    make_failure(sweep / "3_optimizer.lr=-1", "refused", "optimizer.lr must be positive, got -1.0", 0,
                 [*mars, "optimizer.lr=-1"])
    table = make_table(load_runs([str(sweep)]))
    rows = {(row[4], row[5], row[13].split(" ")[0]): [row[7], row[8], row[13]] for row in setting_rows(table)}
    assert rows == {
        ("0.003", "0.025", "0_gamma=0.025"): ["1", "6.000", "0_gamma=0.025"],
        ("0.003", "0.025", "1_gamma=0.025,seed=2"): [
            "1", "failed (diverged; best before: 5.000)",
            "1_gamma=0.025,seed=2 (diverged at step 60: the loss is nan at step 61)"],
        ("0.003", "0.5", "2_gamma=0.5"): ["1", "failed (diverged)", "2_gamma=0.5 (diverged at step 0: the loss is inf "
                                                                    "at step 1)"],
        ("-1", "0.025", "3_optimizer.lr=-1"): [
            "1", "failed (refused)", "3_optimizer.lr=-1 (refused: optimizer.lr must be positive, got -1.0)"]}
    assert table_rows(table, "### Shakespeare (embedded): best validation loss")["MARS-approx"] == ["6.000"]
    assert "A failed run is never averaged with the healthy seeds of its setting" in table


def test_a_run_that_blew_up_after_its_best_shows_that_best_as_a_diverged_runs_and_the_first_table_takes_none(
        tmp_path, make_run, make_failure):
    # Trained to 7.592 at step 20, then resumed with lr 30: 1471 at step 30, where the watch stopped it.
    mars = [*TINY, "optimizer=mars-adamw"]
    blown = make_run(tmp_path / "blown", [*mars, "train.max_iters=40"], [10.8, 7.9, 7.592, 1471.3], 1024,
                     eval_steps=[0, 10, 20, 30])
    make_failure(blown, "diverged", "val loss 1471, above 1.1 x the step-0 val loss 10.8", 30, mars)
    # Diverged at its first evaluation after step 0: the untrained step 0 is no best.
    early = make_run(tmp_path / "early", [*mars, "train.max_iters=40", "optimizer.lr=10"], [10.8, 900.0], 1024,
                     eval_steps=[0, 10])
    make_failure(early, "diverged", "val loss 900, above 1.1 x the step-0 val loss 10.8", 10, mars)
    table = make_table(load_runs([str(tmp_path)]))
    rows = {row[13].split(" ")[0]: row[8:10] for row in setting_rows(table)}
    assert rows == {"blown": ["failed (diverged; best before: 7.592)", "1471.300"],
                    "early": ["failed (diverged)", "900.000"]}
    assert table_rows(table, "### Shakespeare (embedded): best validation loss")["MARS-approx"] == ["–"]


def test_two_runs_of_one_seed_count_once_and_the_table_says_which_it_kept(tmp_path, make_run):
    adamw = [*TINY, "optimizer=adamw"]
    # A sweep interrupted at step 40, then run again in a directory of its own: each holds seed 1337's run.
    make_run(tmp_path / "12-00-00" / "0_optimizer=adamw", adamw, [10.8, 6.5], 1024, eval_steps=[0, 40])
    make_run(tmp_path / "13-00-00" / "0_optimizer=adamw", adamw, [10.8, 6.5, 6.2], 1024, eval_steps=[0, 40, 100])
    make_run(tmp_path / "13-00-00" / "1_seed=2", [*adamw, "train.seed=2"], [10.8, 6.4], 1024)
    table = make_table(load_runs([str(tmp_path)]))
    [row] = setting_rows(table)
    assert row[7:9] == ["2", f"{(6.2 + 6.4) / 2:.3f}"]  # seeds 1337 and 2, nothing stopped
    assert row[13] == ("0_optimizer=adamw, 1_seed=2; left out: 12-00-00/0_optimizer=adamw (seed 1337 as "
                       "13-00-00/0_optimizer=adamw, which trained further (step 100 vs 40))")
    assert "are one run, not two seeds" in table


def test_of_two_finished_runs_of_one_seed_the_newest_is_kept(tmp_path, make_run):
    adamw = [*TINY, "optimizer=adamw"]
    older = make_run(tmp_path / "a" / "0_optimizer=adamw", adamw, [10.8, 6.1], 1024)
    make_run(tmp_path / "b" / "0_optimizer=adamw", adamw, [10.8, 6.3], 1024)
    os.utime(older / "metrics.jsonl", (1e9, 1e9))
    [row] = setting_rows(make_table(load_runs([str(tmp_path)])))
    assert row[7:9] == ["1", "6.300"]
    assert row[13].endswith("left out: a/0_optimizer=adamw (seed 1337 as b/0_optimizer=adamw, which is newer, as far "
                            "as it trained)")


def interpolated(before: tuple[float, float], after: tuple[float, float], target: float) -> float:
    """What lies at ``target`` on the line through (loss, value) points ``before`` and ``after``."""
    (loss0, value0), (loss1, value1) = before, after
    return value0 + (loss0 - target) / (loss0 - loss1) * (value1 - value0)


def test_target_loss_gives_tokens_and_training_time_to_reach_it_and_the_ratio_to_the_first_optimizer(tmp_path,
                                                                                                     make_run):
    make_run(tmp_path / "adamw", [*TINY, "optimizer=adamw"], [10.8, 4.0, 3.0], 1024, step_ms=100.0)
    make_run(tmp_path / "adamw-seed2", [*TINY, "optimizer=adamw", "train.seed=2"], [10.8, 4.0, 3.4], 1024,
             step_ms=100.0)
    make_run(tmp_path / "mars", [*TINY, "optimizer=mars-adamw"], [10.8, 3.0, 2.5], 1024, step_ms=200.0)
    make_run(tmp_path / "muon", [*TINY, "optimizer=muon"], [10.8, 4.0, 3.6], 1024)
    runs = {Path(run.name).name: run for run in load_runs([str(tmp_path)])}
    # Evaluations at steps 0, 50 and 100 of 1,024 tokens; step_ms 100 is 0.1 s a step.
    adamw_steps = [interpolated((4.0, 50), (3.0, 100), 3.5), interpolated((4.0, 50), (3.4, 100), 3.5)]
    mars_step = interpolated((10.8, 0), (3.0, 50), 3.5)
    assert reached(runs["adamw"], 3.5) == Reached(tokens=pytest.approx(adamw_steps[0] * 1024),
                                                  seconds=pytest.approx(adamw_steps[0] * 0.1))
    assert reached(runs["mars"], 3.5) == Reached(tokens=pytest.approx(mars_step * 1024),
                                                 seconds=pytest.approx(mars_step * 0.2))
    assert reached(runs["muon"], 3.5) is None

    table = make_table(list(runs.values()), target_loss=3.5)
    adamw, muon, mars = setting_rows(table.split("### Tokens and training time to validation loss 3.5", 1)[1])
    adamw_tokens = [step * 1024 for step in adamw_steps]
    adamw_seconds = [step * 0.1 for step in adamw_steps]
    assert adamw[3:] == [  # the first row, the reference: AdamW, two seeds
        "AdamW", "0.001", "–", "2",
        f"{count_label(statistics.fmean(adamw_tokens))} ± {count_label(statistics.stdev(adamw_tokens))}",
        f"{duration_label(statistics.fmean(adamw_seconds))} ± {duration_label(statistics.stdev(adamw_seconds))}",
        "1.00x", "1.00x"]
    assert mars[3] == "MARS-approx" and mars[7:] == [
        count_label(mars_step * 1024), duration_label(mars_step * 0.2),
        f"{mars_step * 1024 / statistics.fmean(adamw_tokens):.2f}x",
        f"{mars_step * 0.2 / statistics.fmean(adamw_seconds):.2f}x"]
    assert muon[3] == "Muon" and muon[7:] == ["not reached", "not reached", "–", "–"]
    assert "interpolated linearly between the two evaluations" in table
    assert "### Tokens" not in make_table(list(runs.values()))


def test_cli_takes_a_target_loss(paper_runs, tmp_path, capsys):
    main([str(paper_runs), "--out", str(tmp_path / "table.md"), "--target-loss", "3.3"])
    target = capsys.readouterr().out.split("### Tokens and training time to validation loss 3.3", 1)[1]
    rows = [line.split("|")[4].strip() for line in target.splitlines() if line.startswith("| OpenWebText |")]
    assert rows == ["AdamW", "MARS-approx", "MARS-approx"]


def test_a_wandb_export_reaches_a_target_at_the_presets_tokens_per_step_and_has_no_training_time(tmp_path):
    path = tmp_path / "val_loss.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["Step", "owt-gpt2-small-5b-muon - val/loss"])
        writer.writerows([[0, 10.9], [5_000, 3.5], [10_000, 3.1]])
    run, = load_wandb_csv(path)
    step = interpolated((3.5, 5_000), (3.1, 10_000), 3.3)
    assert reached(run, 3.3) == Reached(tokens=pytest.approx(step * 5e9 / 10_000), seconds=None)
    target = make_table([run], target_loss=3.3).split("### Tokens and training time to validation loss 3.3", 1)[1]
    muon = next(line for line in target.splitlines() if line.startswith("| OpenWebText |"))
    assert [cell.strip() for cell in muon.strip("|").split("|")][7:] == [count_label(step * 5e9 / 10_000), "–",
                                                                         "1.00x", "–"]


BROKEN_CONFIGS = {"empty": b"", "a YAML list": b"- model\n- optimizer\n", "not YAML": b"model: [gpt2\n",
                  "undecodable": b"\xff\xfe\x00model", "a string": b"just a note\n"}


@pytest.mark.parametrize("content", BROKEN_CONFIGS.values(), ids=BROKEN_CONFIGS.keys())
def test_a_run_whose_saved_config_is_broken_is_left_out_with_its_file_named(paper_runs, make_run, tmp_path, caplog,
                                                                            content):
    broken = paper_runs / "broken"
    make_run(broken, ["experiment=owt-gpt2-small-5b-adamw"], [10.9, 3.6, 3.0], TOKENS_PER_STEP)
    (broken / ".hydra" / "config.yaml").write_bytes(content)
    out = tmp_path / "table.md"
    main([str(paper_runs / "*"), "--out", str(out)])
    table = out.read_text()
    assert "3.203 / 3.193 (+0.010)" in table  # the readable runs are tabulated, the broken one's 3.0 is not
    left_out = f"- {broken}: unreadable, {broken / '.hydra' / 'config.yaml'} "
    assert left_out in table and "3.000" not in table
    assert f"warning: skipping {broken}: {broken / '.hydra' / 'config.yaml'} " in caplog.text


@pytest.mark.parametrize("missing", ["optimizer.lr", "train.max_iters", "optimizer"])
def test_a_saved_config_without_a_key_the_labels_need_is_named_and_skipped(paper_runs, make_run, caplog, missing):
    broken = paper_runs / "broken"
    make_run(broken, ["experiment=owt-gpt2-small-5b-adamw"], [10.9, 3.6, 3.0], TOKENS_PER_STEP)
    config = broken / ".hydra" / "config.yaml"
    saved = OmegaConf.load(config)
    section, _, key = missing.partition(".")
    saved[section].pop(key) if key else saved.pop(section)
    OmegaConf.save(saved, config)
    runs = load_runs([str(paper_runs)])
    assert len(runs) == 4 and str(broken) not in [run.name for run in runs]
    # Named either as unreadable (its file) or, for an optimizer key, as written by an older version.
    assert str(broken) in caplog.text and (key or section) in caplog.text


def test_a_broken_failure_record_is_named_and_skipped(paper_runs, caplog):
    broken = paper_runs / "refused"
    broken.mkdir()
    (broken / "failure.json").write_text('{"kind": "refused", "rea')  # a disk that filled mid-write
    assert len(load_runs([str(paper_runs)])) == 4
    assert f"skipping {broken}: {broken / 'failure.json'} is not JSON" in caplog.text


BROKEN_EXPORTS = {"empty": (b"", "no Step column"),
                  "cut short": (b"Step,owt-gpt2-small-5b-muon - val/loss\n0,10.9\n5000\n", "line 3 has 1 fields"),
                  "not a number": (b"Step,owt-gpt2-small-5b-muon - val/loss\n0,ten\n", "could not convert"),
                  "undecodable": (b"Step,\xff\xfe\n", "not a CSV text file")}


@pytest.mark.parametrize("content, problem", BROKEN_EXPORTS.values(), ids=BROKEN_EXPORTS.keys())
def test_a_malformed_wandb_export_stops_with_one_line_naming_it(paper_runs, tmp_path, content, problem):
    export = tmp_path / "val_loss.csv"
    export.write_bytes(content)
    with pytest.raises(SystemExit) as stopped:
        main([str(paper_runs / "*"), "--wandb-csv", str(export), "--out", str(tmp_path / "table.md")])
    assert str(stopped.value).startswith(f"error: {export}") and problem in str(stopped.value)


def test_a_table_that_cannot_be_written_is_one_line_naming_it_and_is_still_printed(paper_runs, tmp_path, capsys):
    out = tmp_path / "table.md"
    out.symlink_to("/dev/full")  # every write to it fails with ENOSPC, as on a full disk
    with pytest.raises(SystemExit) as stopped:
        main([str(paper_runs / "*"), "--out", str(out)])
    assert str(stopped.value) == (f"error: cannot write {out} (No space left on device): free space, or choose "
                                  "another --out")
    assert "3.203 / 3.193 (+0.010)" in capsys.readouterr().out


def test_a_run_an_older_version_wrote_is_left_out_of_the_table_and_listed_with_why(tmp_path, make_run, capsys):
    base = ["optimizer=muon", "train.max_iters=10"]
    old = make_run(tmp_path / "old", base, [10.8, 6.0], 1024)
    make_run(tmp_path / "authors", [*base, "train.seed=2"], [10.8, 6.2], 1024)
    config = old / ".hydra" / "config.yaml"  # as saved before Muon had the authors' AdamW and bfloat16 updates
    config.write_text("\n".join(line for line in config.read_text().splitlines()
                                if "adamw_variant" not in line and "update_dtype" not in line))
    main([str(tmp_path / "*"), "--out", str(tmp_path / "table.md")])
    table = capsys.readouterr().out
    assert "| 1 | 6.200 |" in table and "| 2 |" not in table  # one seed: the old run is not pooled with it
    assert (f"- {old}: left out, written by an older version of this project (its config has no "
            "optimizer.adamw_variant, optimizer.update_dtype): train it again to tabulate it") in table


def test_the_untrained_step_0_is_no_best_and_the_final_loss_stands_beside_the_best(tmp_path, make_run):
    # Rose after its first evaluation (a late blow-up below the divergence limit): best 7.0, final 9.5.
    make_run(tmp_path / "late", [*TINY, "optimizer=adamw"], [10.8, 7.0, 9.5], 1024)
    # Within its first 102K tokens (100 steps, the other run's budget) evaluated at step 0 alone: no "within" row
    # takes the untrained model's loss.
    make_run(tmp_path / "early", [*TINY, "optimizer=mars-adamw", "train.max_iters=400"], [10.822, 11.5], 1024,
             eval_steps=[0, 300])
    table = make_table(load_runs([str(tmp_path)]))
    late, early = sorted(setting_rows(table), key=lambda row: row[3])
    assert late[3] == "AdamW" and late[8:10] == ["7.000", "9.500"]
    assert early[3] == "MARS-approx" and early[8:10] == ["11.500*", "11.500*"]  # * stopped at step 300
    assert "10.822" not in table


def readme_table_commands() -> list[list[str]]:
    """The arguments of each make_table command of the README, in its order."""
    lines = (REPOSITORY / "README.md").read_text().splitlines()
    commands = [shlex.split(line, comments=True) for line in lines if line.startswith("python -m scripts.make_table ")]
    return [command[3:] for command in commands]


def test_the_readmes_table_commands_run_top_to_bottom_keep_each_ones_table(tmp_path, make_run, monkeypatch, caplog):
    # Sweeps of two days and a single run: the README's patterns match runs whose deepest shared directory is
    # multirun/, where the first command writes its --out.
    make_run(tmp_path / "multirun" / "2026-11-25" / "10-00-00" / "0_seed1", ["experiment=owt-gpt2-small-5b-adamw"],
             [10.9, 3.6, 3.201], TOKENS_PER_STEP)
    make_run(tmp_path / "multirun" / "2026-11-26" / "10-00-00" / "0_gamma",
             ["experiment=owt-gpt2-small-5b-mars-approx"], [10.9, 3.4, 3.110], TOKENS_PER_STEP)
    make_run(tmp_path / "outputs" / "2026-11-24" / "09-00-00", ["experiment=owt-gpt2-small-5b-adamw", "train.seed=2"],
             [10.9, 3.7, 3.205], TOKENS_PER_STEP)
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    commands = readme_table_commands()
    assert len(commands) >= 2
    written = {}
    for argv in commands:
        caplog.clear()
        main(argv)
        said = caplog.records[-1].getMessage()
        out = Path(said.removeprefix("wrote ")).resolve()
        assert said.startswith("wrote ") and out not in written, caplog.text  # a file of its own, none replaced
        written[out] = shlex.join(["python", "-m", "scripts.make_table", *argv])
    for out, command in written.items():
        assert out.read_text().startswith(f"<!-- {command} ("), out
    assert sum("### Tokens and training time" in out.read_text() for out in written) == 1


def test_a_table_written_over_an_existing_file_says_it_replaced_it(paper_runs, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    out = paper_runs / "val_loss_table.md"
    out.write_text("an earlier table")
    main([str(paper_runs / "*")])
    assert caplog.records[-1].getMessage() == f"replaced {out}" and "3.203 / 3.193" in out.read_text()
    main([str(paper_runs / "*"), "--target-loss", "3.3"])  # its own file: the table above stays
    assert caplog.records[-1].getMessage() == f"wrote {paper_runs / 'val_loss_table_target_3.3.md'}"
    assert "### Tokens" not in out.read_text()


C4_TOKENS_PER_STEP = 512 * 256


def test_c4_runs_show_their_perplexity_at_the_best_evaluation_beside_galores_full_rank_baseline(tmp_path, make_run):
    adamw = ["experiment=c4-llama-60m-adamw"]
    # evaluated at steps 0, 5,000 and 10,000: the best after step 0 is step 5,000's, not the last
    make_run(tmp_path / "adamw-seed0", adamw, [10.4, 3.50, 3.55], C4_TOKENS_PER_STEP)
    make_run(tmp_path / "adamw-seed1", [*adamw, "train.seed=1"], [10.4, 3.56, 3.54], C4_TOKENS_PER_STEP)
    make_run(tmp_path / "muon", ["experiment=c4-llama-60m-muon"], [10.4, 3.40, 3.30], C4_TOKENS_PER_STEP)
    table = make_table(load_runs([str(tmp_path)]))
    rows = table_rows(table, "### C4: validation perplexity, ours / literature (difference)")
    assert rows["optimizer"] == ["LLaMA 60m, 1.31B tokens (10,000 steps)"]
    ours = math.exp(statistics.fmean([3.50, 3.54]))  # each seed's best, averaged as losses
    assert rows["AdamW"] == [f"{ours:.2f} / 34.06 ({ours - 34.06:+.2f})"]
    assert rows["Muon"] == [f"{math.exp(3.30):.2f}"]  # nobody published Muon there
    assert "GaLore, ICML 2024 (arXiv 2403.03507v2), Table 2, row Full-Rank" in table
    assert "### C4: best validation loss" not in table  # the loss stays in the table of every setting


def test_a_c4_run_of_other_steps_than_galores_shows_no_literature_figure(tmp_path, make_run):
    make_run(tmp_path / "short", ["experiment=c4-llama-60m-adamw", "train.max_iters=5000", "train.warmup_iters=500"],
             [10.4, 3.9, 3.7], C4_TOKENS_PER_STEP)
    rows = table_rows(make_table(load_runs([str(tmp_path)])), "### C4: validation perplexity")
    assert rows["optimizer"] == ["LLaMA 60m, 655M tokens (5,000 steps)"]
    assert rows["AdamW"] == [f"{math.exp(3.7):.2f}"]


def test_literature_numbers_are_galores_table_2_at_its_scripts_steps():
    assert LITERATURE_PERPLEXITY == {("c4", "llama-60m", 10_000): {"adamw": 34.06},
                                     ("c4", "llama-130m", 20_000): {"adamw": 25.08},
                                     ("c4", "llama-350m", 60_000): {"adamw": 18.80},
                                     ("c4", "llama-1b", 100_000): {"adamw": 15.56}}
    for (_, model, steps), _ in LITERATURE_PERPLEXITY.items():
        assert load(f"experiment=c4-{model}-adamw").train.max_iters == steps
