"""One run per directory, storage faults caught early: locks, claims, writability and failed saves."""
import datetime
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from configs import schema
from training.checkpoint import CheckpointSaveError, checkpoint_dir, latest_checkpoint, save_checkpoint
from training.metrics import read_metrics
from training.run_dir import RunDirectoryError, RunDirectoryLock, check_writable, claim_for_fresh_start

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
         "train.eval_iters=2", "train.warmup_iters=2", "train.log_interval=1", "train.device=cpu",
         "train.max_iters=4", "train.eval_interval=4", "train.checkpoint_interval=2"]

HOLD_LOCK = """
import sys, time
from training.run_dir import RunDirectoryLock
lock = RunDirectoryLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(600)
"""


def train(run_dir, *overrides, limit_file_bytes=None, cwd=REPO, timeout=600):
    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, limit_file_bytes))

    run_dir_override = [f"hydra.run.dir={run_dir}"] if run_dir else []
    return subprocess.run([sys.executable, str(REPO / "train.py"), *run_dir_override, *SMALL, *overrides], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit_file_size if limit_file_bytes else None)


def assert_one_line_error(result, *phrases):
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr


def test_a_second_run_in_a_locked_directory_is_refused_naming_the_holder(tmp_path):
    with RunDirectoryLock(tmp_path):
        result = train(tmp_path, "train.resume=true")
    assert_one_line_error(result, "is in use by a running training run", f"pid {os.getpid()}")
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / ".hydra").exists()


def test_the_lock_of_a_process_that_died_does_not_block_its_resume(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(RunDirectoryError):
        RunDirectoryLock(tmp_path).acquire()
    holder.kill()  # SIGKILL: no cleanup runs, the lock file stays behind
    holder.wait()
    assert (tmp_path / "run.lock").exists()
    result = train(tmp_path, "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert [r["step"] for r in read_metrics(tmp_path) if "val/loss" in r] == [0, 4]


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(schema, "_claimed_run_dirs", {})
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)

    class FrozenClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 11, 23, 12, 0, 0)

    monkeypatch.setattr(schema.datetime, "datetime", FrozenClock)
    first = schema.unique_run_dir("outputs")
    assert schema.unique_run_dir("outputs") == first  # one claim per process
    schema._claimed_run_dirs.clear()  # as another process would
    second = schema.unique_run_dir("outputs")
    assert (first, second) == ("outputs/2026-11-23/12-00-00", "outputs/2026-11-23/12-00-00-2")
    assert Path(first).is_dir() and Path(second).is_dir()


def test_torchrun_ranks_share_the_run_id_directory(monkeypatch):
    monkeypatch.setattr(schema, "_claimed_run_dirs", {})
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc123")
    assert schema.unique_run_dir("outputs") == "outputs/torchrun-abc123"


@pytest.mark.slow
def test_two_runs_launched_together_without_a_run_dir_write_to_two_directories(tmp_path):
    launches = [subprocess.Popen([sys.executable, str(REPO / "train.py"), *SMALL], cwd=tmp_path,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for launch in launches:
        assert launch.wait(timeout=600) == 0, launch.stderr.read()
    run_dirs = sorted(path.parent for path in tmp_path.glob("outputs/*/*/metrics.jsonl"))
    assert len(run_dirs) == 2
    for run_dir in run_dirs:  # each its own run: one evaluation at 0 and one at 4, not interleaved
        assert [r["step"] for r in read_metrics(run_dir) if "val/loss" in r] == [0, 4]


def test_a_checkpoint_directory_that_cannot_be_written_stops_the_run_before_its_first_step(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    result = train(tmp_path)
    assert_one_line_error(result, "cannot write checkpoints to", "hydra.run.dir")
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_run_directory_is_found_at_start(tmp_path):
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(RunDirectoryError, match="cannot write checkpoints"):
            check_writable(tmp_path)
    finally:
        tmp_path.chmod(0o755)


def test_a_full_disk_during_a_save_removes_the_partial_file_keeps_the_previous_checkpoint_and_says_what_is_lost(
        tmp_path):
    assert train(tmp_path, "train.max_iters=2").returncode == 0
    checkpoint_bytes = (checkpoint_dir(tmp_path) / "ckpt_00000002.pt").stat().st_size
    # Small files (logs, configs) still fit; the next checkpoint does not.
    result = train(tmp_path, "train.resume=true", limit_file_bytes=checkpoint_bytes // 2)
    assert_one_line_error(result, "could not write", "ckpt_00000004.pt", "(step 4)",
                          "ckpt_00000002.pt is intact: 2 steps are lost")
    assert sorted(p.name for p in checkpoint_dir(tmp_path).iterdir()) == ["ckpt_00000002.pt"]
    resumed = train(tmp_path, "train.resume=true")  # with space again, the run goes on from step 2
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stdout and "ckpt_00000002.pt at step 2" in resumed.stdout


def test_a_failed_first_save_says_every_step_is_lost(tmp_path):
    result = train(tmp_path, limit_file_bytes=1 << 20)
    assert_one_line_error(result, "could not write", "no earlier checkpoint exists: all 2 steps are lost")
    assert list(checkpoint_dir(tmp_path).iterdir()) == []


def test_a_failed_save_leaves_no_partial_file(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 2, {"step": 2}, keep=2)
    real_save = torch.save

    def save_half_then_fail(state, f):
        real_save(state, f)
        f.truncate(10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", save_half_then_fail)
    with pytest.raises(CheckpointSaveError, match="No space left on device"):
        save_checkpoint(tmp_path, 4, {"step": 4}, keep=2)
    assert sorted(p.name for p in checkpoint_dir(tmp_path).iterdir()) == ["ckpt_00000002.pt"]
    assert latest_checkpoint(tmp_path, torch.device("cpu"))[1]["step"] == 2


def test_a_partial_file_left_by_a_killed_save_is_removed_at_start(tmp_path):
    assert train(tmp_path, "train.max_iters=2").returncode == 0
    partial = checkpoint_dir(tmp_path) / "ckpt_00000004.pt.tmp"
    partial.write_bytes(b"half a checkpoint")
    result = train(tmp_path, "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert not partial.exists() and "a checkpoint save that never finished" in result.stdout


def test_overwrite_deletes_the_previous_runs_checkpoints_and_log_only(tmp_path):
    save_checkpoint(tmp_path, 8, {"step": 8}, keep=2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "notes.txt").write_text("the user's own file")
    with pytest.raises(RunDirectoryError, match="train.overwrite=true"):
        claim_for_fresh_start(tmp_path, overwrite=False)
    claim_for_fresh_start(tmp_path, overwrite=True)
    assert list(checkpoint_dir(tmp_path).iterdir()) == [] and not (tmp_path / "metrics.jsonl").exists()
    assert (tmp_path / "notes.txt").exists()
