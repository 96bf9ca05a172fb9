"""The markdown table: our best validation loss beside the paper's, in the paper's layout, and every setting."""
import csv
import json
import logging
from pathlib import Path

from scripts.make_table import PAPER_VAL_LOSS, load_wandb_csv, main, make_table
from scripts.runs import load_runs

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
    assert adamw[3:9] == ["AdamW", "0.0006", "–", "2", "3.203", "0.003"]
    assert best_mars[3:8] == ["MARS-approx", "0.006", "0.025", "1", "3.110"]
    assert other_mars[5] == "0.05" and other_mars[7] == "3.120"
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
    assert cells[6:8] == ["3", "3.302*"]
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
    assert rows["OpenWebText"][7:10] == ["3.203", "0.003", "3.211"]
    # A run evaluated on fixed windows: its best is the fixed-window figure.
    assert rows["Shakespeare (embedded)"][7] == rows["Shakespeare (embedded)"][9] == "6.250"
    assert "fixed windows: the best on the same windows at every evaluation" in table
