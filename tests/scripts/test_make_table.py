"""The markdown table: our best validation loss beside the paper's, in the paper's layout, and every setting."""
import csv

from scripts.make_table import PAPER_VAL_LOSS, load_wandb_csv, main, make_table
from scripts.runs import load_runs


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
