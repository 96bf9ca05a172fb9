import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.check_trainer_against_authors import RUNNER, compare, main, our_losses, their_losses
from training.metrics import read_metrics

STAND_IN = Path(__file__).parent / "stand_ins" / "authors_style_trainer.py"


def run_stand_in(tmp_path, patches, *args):
    return subprocess.run([sys.executable, str(RUNNER), str(STAND_IN), json.dumps(patches), "--", *args],
                          cwd=tmp_path, capture_output=True, text=True)


def write_our_metrics(run_dir: Path, train_offset: float = 0.0) -> None:
    records = [{"step": step + 1, "train/loss": 5.0 - step + (train_offset if step >= 2 else 0.0)} for step in range(4)]
    records += [{"step": step, "train/loss_estimate": 5.0 - step, "val/loss": 5.5 - step} for step in (0, 2)]
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_refuses_without_the_authors_code_in_one_line_naming_the_fix(tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["--authors-dir", str(tmp_path / "absent")])
    message = str(exit_info.value)
    assert "\n" not in message and "give a checkout of AGI-Arena/MARS" in message


def test_equal_logs_match_and_a_difference_is_found_at_its_first_step(tmp_path):
    theirs = run_stand_in(tmp_path, [], "--offset=0.25")
    assert theirs.returncode == 0, theirs.stderr
    write_our_metrics(tmp_path / "ours")
    row = compare(their_losses(theirs.stdout), our_losses(read_metrics(tmp_path / "ours")))
    assert row["train"] == pytest.approx(0.25) and row["val"] == pytest.approx(0.25)
    assert row["estimate"] == 0.0 and row["first_differing_step"] == 0 and "missing" not in row
    same = run_stand_in(tmp_path, [])
    row = compare(their_losses(same.stdout), our_losses(read_metrics(tmp_path / "ours")))
    assert row["train"] == row["val"] == row["best_val"] == 0.0 and row["first_differing_step"] is None


def test_a_patch_changes_their_file_in_memory_before_it_runs(tmp_path):
    patched = run_stand_in(tmp_path, [["halve the step", "5.0 - step", "5.0 - step / 2"]])
    assert patched.returncode == 0, patched.stderr
    assert their_losses(patched.stdout)["train"][2] == 4.0


def test_a_patch_that_no_longer_applies_stops_the_run_by_name(tmp_path):
    result = run_stand_in(tmp_path, [["move the data to the cpu", "x.pin_memory()", "x"]])
    assert result.returncode != 0
    assert "patch 'move the data to the cpu' does not apply" in result.stderr
    assert "iter 0" not in result.stdout
