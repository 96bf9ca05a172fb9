"""A launch refused for a run's directory, a refused resume of the run and a resume with nothing to do leave the run
as it was: its files byte for byte, and so its row of the table."""
import shutil
import sys
from pathlib import Path

import pytest

from scripts.make_table import make_table
from reporting.run_selection import load_runs
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
        "train.eval_iters=2", "train.warmup_iters=0", "train.log_interval=1", "train.device=cpu",
        "train.eval_interval=2"]


def train(run_dir, *overrides):
    return warm_python.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *TINY, *overrides], cwd=REPO,
                           timeout=600)


def files(run_dir: Path) -> dict[str, bytes]:
    return {path.relative_to(run_dir).as_posix(): path.read_bytes() for path in sorted(run_dir.rglob("*"))
            if path.is_file()}


def table_row(run_dir: Path) -> str:
    [row] = [line for line in make_table(load_runs([str(run_dir)])).splitlines()
             if line.startswith("| Shakespeare (embedded) | 1x32 |")]
    return row


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    result = train(run_dir, "train.max_iters=4")
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("overrides, exit_status, told", [
    (["train.max_iters=4"], 1, "already holds a run"),  # a fresh launch into it
    (["train.resume=true", "train.max_iters=6", "model.n_embd=64"], 1, "cannot resume"),  # the model's shape
    (["train.resume=true", "train.max_iters=6", "optimizer.is_approx=false"], 1, "cannot resume"),  # MARS's scheme
    (["train.resume=true", "train.max_iters=2"], 1, "is at step 4, past train.max_iters=2"),  # below its step
    (["train.resume=true", "train.max_iters=4", "optimizer.lr=1e-3"], 0, "nothing to do"),  # finished
], ids=["fresh-launch", "model-shape", "mars-scheme", "max-iters-below-its-step", "nothing-to-do"])
def test_a_launch_that_does_not_train_leaves_the_finished_runs_files_and_table_row_as_they_were(
        finished_run, tmp_path, overrides, exit_status, told):
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    before, row = files(run_dir), table_row(run_dir)
    result = train(run_dir, *overrides)
    assert result.returncode == exit_status, result.stderr
    assert told in (result.stderr.strip().splitlines()[-1] if exit_status else result.stdout), result.stderr
    assert files(run_dir) == before  # no failure.json, no line added to train.log, run.lock's holder as it was
    assert table_row(run_dir) == row


@pytest.mark.slow
def test_a_resume_below_the_runs_step_names_its_step_and_what_to_do(finished_run, tmp_path):
    run_dir = shutil.copytree(finished_run, tmp_path / "run")
    result = train(run_dir, "train.resume=true", "train.max_iters=2")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {run_dir} is at step 4, past train.max_iters=2: a resume cannot train back to an earlier step. "
        "Resume with train.max_iters=4 or more, or start over in it with train.overwrite=true")
