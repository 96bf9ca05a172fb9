"""scripts.check_trainer_against_authors and the runner of their trainer files, without the authors' code (which the
repository does not hold): the refusal of a directory that is not their checkout, the patching of their files (a
patch that no longer applies stops the run, naming it), and the comparison, with a stand-in trainer that logs
in their format."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import authors_trainer_runner as runner
from scripts import check_trainer_against_authors as check
from tests import warm_python

REPO_ROOT = Path(__file__).resolve().parents[2]
STAND_IN = Path(__file__).resolve().parent / "authors_stand_in" / "train_stand_in.py"
FAMILY = next(family for family in check.FAMILIES if family.name == "mars-adamw-approx")


def stand_in_checkout(root: Path, trainer_text: str | None = None) -> Path:
    """A folder laid out as their checkout for FAMILY, its trainer the stand-in (or ``trainer_text``)."""
    (root / FAMILY.trainer).parent.mkdir(parents=True)
    (root / FAMILY.trainer).write_text(trainer_text if trainer_text is not None else STAND_IN.read_text())
    (root / FAMILY.config).parent.mkdir(parents=True)
    (root / FAMILY.config).write_text("wandb_log = True\n")
    return root


def run_runner(trainer: Path, patches: list[dict], tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "patches.json").write_text(json.dumps(patches))
    return subprocess.run([sys.executable, str(check.RUNNER), "--patches", str(tmp_path / "patches.json"),
                           "--record", str(tmp_path / "record.jsonl"), str(trainer), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_a_directory_without_their_trainer_files_is_refused_in_one_line_naming_the_missing_file(tmp_path):
    (tmp_path / "MARS").mkdir()
    (tmp_path / "MARS" / "train_adamw.py").write_text("")
    result = warm_python.run([sys.executable, "-m", "scripts.check_trainer_against_authors", "--authors-dir",
                              str(tmp_path), "--output-dir", str(tmp_path / "results")],
                             cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"--authors-dir {tmp_path} does not look like a checkout of AGI-Arena/MARS: "
        "config/train_gpt2_small_adamw.py is missing"]
    assert not (tmp_path / "results").exists()


def test_a_patch_whose_text_is_not_there_once_is_refused_naming_it():
    patch = {"name": "ddp-cpu-module", "file": "train.py", "old": "DDP(model, device_ids=[0])", "new": "DDP(model)"}
    assert runner.apply_patches(Path("train.py"), "x = DDP(model, device_ids=[0])\n", [patch]) == "x = DDP(model)\n"
    assert runner.apply_patches(Path("other.py"), "unchanged", [patch]) == "unchanged"
    stale = "patch 'ddp-cpu-module' no longer applies to train.py: .* is not there"
    with pytest.raises(runner.PatchError, match=stale):
        runner.apply_patches(Path("train.py"), "x = DDP(model, device_ids=[rank])\n", [patch])
    with pytest.raises(runner.PatchError, match="occurs 2 times"):
        runner.apply_patches(Path("train.py"), "DDP(model, device_ids=[0])\nDDP(model, device_ids=[0])\n", [patch])


def test_a_stale_patch_stops_their_trainer_before_it_runs_in_one_line(tmp_path):
    authors = stand_in_checkout(tmp_path / "authors", STAND_IN.read_text().replace("device_ids=[ddp_local_rank]",
                                                                                   "device_ids=[local_rank]"))
    patches = [patch.for_runner(authors) for patch in check.patches_for(FAMILY)]
    result = run_runner(authors / FAMILY.trainer, patches, tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"patch 'ddp-cpu-module' no longer applies to {authors / FAMILY.trainer}: its text "
        "'DDP(model, device_ids=[ddp_local_rank])' is not there; update the patch for this version of their code"]
    assert not (tmp_path / "record.jsonl").exists()


def test_the_runner_patches_the_modules_their_trainer_imports_and_records_what_it_logs(tmp_path):
    # As their trainers do: `from optimizers.muon import Muon` from a folder without __init__.py beside them.
    (tmp_path / "theirs" / "optimizers").mkdir(parents=True)
    (tmp_path / "theirs" / "optimizers" / "buffer.py").write_text("DEVICE = 'cuda'\n")
    (tmp_path / "theirs" / "train.py").write_text(
        "import sys\nimport wandb\nfrom optimizers.buffer import DEVICE\nbest_val_loss = 1e9\n"
        "wandb.init(project='mars')\nfor k in range(2):\n"
        "    wandb.log({'iter': k, 'train/loss': 3.25 - k, 'device': DEVICE, 'args': sys.argv[1:]}, step=k)\n"
        "best_val_loss = 2.5\n")
    patches = [{"name": "buffer-device", "file": str(tmp_path / "theirs" / "optimizers" / "buffer.py"),
                "old": "'cuda'", "new": "'cpu'"}]
    result = run_runner(tmp_path / "theirs" / "train.py", patches, tmp_path, "--batch_size=8")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "record.jsonl").read_text().splitlines()]
    assert records == [{"step": 0, "iter": 0, "train/loss": 3.25, "device": "cpu", "args": ["--batch_size=8"]},
                       {"step": 1, "iter": 1, "train/loss": 2.25, "device": "cpu", "args": ["--batch_size=8"]},
                       {"best_val_loss": 2.5}]


@pytest.mark.slow
def test_a_checkout_where_a_patch_no_longer_applies_is_refused_before_anything_runs(tmp_path):
    authors = stand_in_checkout(tmp_path / "authors", STAND_IN.read_text().replace(
        "    torch.cuda.set_device(device)\n", "    torch.cuda.set_device(device)  # another version\n"))
    result = warm_python.run([sys.executable, "-m", "scripts.check_trainer_against_authors", "--authors-dir",
                              str(authors), "--only", FAMILY.name, "--work-dir", str(tmp_path / "work"),
                              "--output-dir", str(tmp_path / "results")],
                             cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"patch 'ddp-device' no longer applies to {authors / FAMILY.trainer}: its text "
        "\"    device = f'cuda:{ddp_local_rank}'\\n    torch.cuda.set_device(device)\\n\" is not there; update the "
        "patch for this version of their code"]
    assert not (tmp_path / "work").exists() and not (tmp_path / "results").exists()


def test_families_that_share_a_trainer_file_are_each_checked_against_its_text_as_they_run(tmp_path):
    # Every MARS family patches MARS/train_mars.py, each in its own run: checked together, the second family's patch
    # met the text the first had already patched, and a full run refused their own checkout.
    sharing = [family for family in check.FAMILIES if family.trainer == FAMILY.trainer]
    assert len(sharing) > 1
    authors = stand_in_checkout(tmp_path / "authors")
    for family in sharing:
        for needed in family.needs:
            if not (authors / needed).exists():
                (authors / needed).write_text("wandb_log = True\n")
    check.check_authors_dir(authors, sharing)


def test_their_iteration_k_is_our_step_k_plus_one_and_their_evaluations_are_ours():
    theirs = check.their_curves([
        {"step": 0, "train/loss": 5.0, "val/loss": 6.0}, {"step": 0, "train/loss": 7.0, "lr": 0.0},
        {"step": 1, "train/loss": 4.0, "lr": 0.1}, {"step": 2, "train/loss": 5.5, "val/loss": 5.75},
        {"step": 2, "train/loss": 9.0, "lr": 0.2}, {"best_val_loss": 5.75}], steps=2)
    assert theirs == check.Curves(train_loss={1: 7.0, 2: 4.0}, lr={1: 0.0, 2: 0.1}, val_loss={0: 6.0, 2: 5.75},
                                  train_estimate={0: 5.0, 2: 5.5}, best_val_loss=5.75)
    ours = check.our_curves([
        {"step": 0, "train/loss_estimate": 5.0, "val/loss": 6.0, "val/loss_fixed": 1.0},
        {"step": 1, "train/loss": 7.0, "lr": 0.0}, {"step": 2, "train/loss": 4.0, "lr": 0.1},
        {"step": 2, "train/loss_estimate": 5.5, "val/loss": 5.5}])
    assert ours.best_val_loss == 5.5
    summary = check.compare(ours, theirs)
    assert summary["first_differing_step"] == 2 and summary["first_differing"] == ["val_loss"]
    assert summary["figures"]["val_loss"]["max_abs_diff"] == 0.25
    assert summary["figures"]["train_loss"]["max_abs_diff"] == 0 == summary["figures"]["lr"]["max_abs_diff"]
    assert summary["best_val_loss"] == {"ours": 5.5, "theirs": 5.75, "diff": 0.25}
    assert "| mars | 2 | 2 | 0 | 2.5e-01 | 0 | 2.5e-01 | 2 (val_loss) |" in check.markdown_table({"mars": summary})


@pytest.mark.slow
@pytest.mark.slow
def test_a_stand_in_trainer_logging_our_run_shifted_from_step_9_is_reported_differing_from_step_9(tmp_path,
                                                                                                     monkeypatch):
    authors = stand_in_checkout(tmp_path / "authors")
    work_dir = tmp_path / "work"
    monkeypatch.setenv("STAND_IN_METRICS", str(work_dir / "runs" / f"{FAMILY.name}-ours" / "metrics.jsonl"))
    monkeypatch.setenv("STAND_IN_SHIFT_FROM", "9")
    monkeypatch.setenv("STAND_IN_SHIFT", "0.001")
    check.main(["--authors-dir", str(authors), "--only", FAMILY.name, "--steps", "12", "--eval-interval", "4",
                "--eval-iters", "1", "--work-dir", str(work_dir), "--output-dir", str(tmp_path / "results")])
    record = json.loads((tmp_path / "results" / "check_against_authors_trainer_cpu.json").read_text())
    summary = record["summaries"][FAMILY.name]
    figures = summary["figures"]
    assert [row["step"] for row in figures["train_loss"]["rows"]] == list(range(1, 13))
    assert [row["step"] for row in figures["val_loss"]["rows"]] == [0, 4, 8, 12]
    assert figures["train_loss"]["only_ours"] == figures["train_loss"]["only_theirs"] == []
    assert figures["val_loss"]["max_abs_diff"] == figures["train_estimate"]["max_abs_diff"] == 0
    assert figures["lr"]["max_abs_diff"] == 0 and summary["best_val_loss"]["diff"] == 0
    assert figures["train_loss"]["max_abs_diff"] == pytest.approx(0.001)
    assert summary["first_differing_step"] == 9 and summary["first_differing"] == ["train_loss"]
    table = (tmp_path / "results" / "check_against_authors_trainer_cpu.md").read_text()
    assert f"| {FAMILY.name} | 12 | 4 | 1.0e-03 | 0 | 0 | 0 | 9 (train_loss) |" in table
    assert f"`{FAMILY.trainer}:" in table and "(ddp-device)" in table and "(ddp-cpu-module)" in table
    assert (work_dir / "runs" / f"{FAMILY.name}-theirs" / "wandb.jsonl").is_file()
