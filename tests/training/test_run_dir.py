"""One run per directory, storage faults caught early: locks, claims, writability and failed saves."""
import datetime
import fcntl
import os
import resource
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests import warm_python
from tests.source_copy import copy_source_tree
from training import run_dir as run_dir_module
from training.checkpoint import CheckpointSaveError, checkpoint_dir, latest_checkpoint, save_checkpoint
from training.metrics import read_metrics
from training.run_dir import (RunDirectoryError, RunDirectoryLock, claim_for_fresh_start,
                               prepare_run_dir)

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

    command = [sys.executable, str(REPO / "train.py"), *([f"hydra.run.dir={run_dir}"] if run_dir else []), *SMALL,
               *overrides]
    if limit_file_bytes is None:
        return warm_python.run(command, cwd=cwd, timeout=timeout)
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, preexec_fn=limit_file_size)


def assert_one_line_error(result, *phrases):
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr


@pytest.mark.slow
def test_a_second_run_in_a_locked_directory_is_refused_naming_the_holder(tmp_path):
    with RunDirectoryLock(tmp_path):
        result = train(tmp_path, "train.resume=true")
    assert_one_line_error(result, "is in use by a running training run", f"pid {os.getpid()}")
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / ".hydra").exists()


@pytest.mark.slow
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


@pytest.mark.slow
def test_deleting_run_lock_does_not_unlock_the_directory_of_a_live_run(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(RunDirectoryError, match=f"pid {holder.pid}"):
            RunDirectoryLock(tmp_path).acquire()
        (tmp_path / "run.lock").unlink()  # taken for a stale lock file
        with pytest.raises(RunDirectoryError, match="in use by a running training run \\(another process\\)"):
            RunDirectoryLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()


def test_a_run_lock_replaced_while_it_is_being_locked_is_locked_again(tmp_path, monkeypatch):
    # As on NFS, where another host's run is seen through run.lock's lock only: it replaces the file after this
    # run opened it, so this run's flock succeeds on a file that is no longer run.lock.
    real_flock, other_run = fcntl.flock, []

    def flock_after_another_run_replaced_the_file(target, operation):
        fd = target if isinstance(target, int) else target.fileno()
        if not other_run and stat.S_ISREG(os.fstat(fd).st_mode):  # this run's first flock of run.lock
            (tmp_path / "run.lock").unlink()
            other_run.append(open(tmp_path / "run.lock", "a+"))
            other_run[0].write("host elsewhere, pid 7\n")
            other_run[0].flush()
            real_flock(other_run[0], fcntl.LOCK_EX | fcntl.LOCK_NB)
        real_flock(target, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_another_run_replaced_the_file)
    try:
        with pytest.raises(RunDirectoryError, match="host elsewhere, pid 7"):
            RunDirectoryLock(tmp_path).acquire()
    finally:
        other_run[0].close()


def nfs_like(monkeypatch):
    """Directories without flock, as on NFS across hosts: run.lock's lock is the only one another run sees."""
    monkeypatch.setattr(RunDirectoryLock, "_lock_directory", lambda self: None)


def test_a_run_lock_deleted_while_the_run_lives_is_locked_again_before_the_next_checkpoint(tmp_path, monkeypatch):
    nfs_like(monkeypatch)
    with RunDirectoryLock(tmp_path) as lock:
        lock.hold_on()  # nothing happened: nothing to do
        (tmp_path / "run.lock").unlink()  # taken for a stale lock file
        lock.hold_on()
        assert f"pid {os.getpid()}" in (tmp_path / "run.lock").read_text()
        with pytest.raises(RunDirectoryError, match="in use by a running training run"):
            RunDirectoryLock(tmp_path).acquire()  # the directory is protected again


def test_a_run_whose_deleted_run_lock_another_run_took_stops_before_writing_naming_it(tmp_path, monkeypatch):
    nfs_like(monkeypatch)
    with RunDirectoryLock(tmp_path) as lock:
        (tmp_path / "run.lock").unlink()
        other_run = RunDirectoryLock(tmp_path)
        other_run.acquire()  # what the deletion let in
        try:
            with pytest.raises(RunDirectoryError, match=f"deleted or replaced .* another run \\(host .*pid "
                                                        f"{os.getpid()}.*\\) has locked .* two runs write into it"):
                lock.hold_on()
            with pytest.raises(RunDirectoryError):  # and it keeps saying so at every checkpoint
                lock.hold_on()
        finally:
            other_run.release()


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_dir_module, "_claimed_run_dirs", {})
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)

    class FrozenClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 11, 23, 12, 0, 0)

    monkeypatch.setattr(run_dir_module.datetime, "datetime", FrozenClock)
    first = run_dir_module.unique_run_dir("outputs")
    assert run_dir_module.unique_run_dir("outputs") == first  # one claim per process
    run_dir_module._claimed_run_dirs.clear()  # as another process would
    second = run_dir_module.unique_run_dir("outputs")
    assert (first, second) == ("outputs/2026-11-23/12-00-00", "outputs/2026-11-23/12-00-00-2")
    assert Path(first).is_dir() and Path(second).is_dir()


def test_torchrun_ranks_share_the_run_id_directory(monkeypatch):
    monkeypatch.setattr(run_dir_module, "_claimed_run_dirs", {})
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc123")
    assert run_dir_module.unique_run_dir("outputs") == "outputs/torchrun-abc123"


@pytest.mark.slow
def test_two_runs_launched_together_without_a_run_dir_write_to_two_directories(tmp_path):
    launches = [warm_python.start([sys.executable, str(REPO / "train.py"), *SMALL], cwd=tmp_path,
                                  stdout=os.devnull, stderr=tmp_path / f"{i}.err") for i in range(2)]
    for i, launch in enumerate(launches):
        assert launch.wait(timeout=600) == 0, (tmp_path / f"{i}.err").read_text()
    run_dirs = sorted(path.parent for path in tmp_path.glob("outputs/*/*/metrics.jsonl"))
    assert len(run_dirs) == 2
    for run_dir in run_dirs:  # each its own run: one evaluation at 0 and one at 4, not interleaved
        assert [r["step"] for r in read_metrics(run_dir) if "val/loss" in r] == [0, 4]


@pytest.mark.slow
def test_a_checkpoint_directory_that_cannot_be_written_stops_the_run_before_its_first_step(tmp_path):
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    result = train(tmp_path)
    assert_one_line_error(result, "cannot write checkpoints to", "hydra.run.dir")
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_read_only_run_directory_is_found_at_start(tmp_path):
    from tests.test_one_line_errors import environment, without_root_file_access

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)
    check = "import sys; from training.run_dir import check_writable; check_writable(sys.argv[1])"
    result = subprocess.run([*without_root_file_access(), sys.executable, "-c", check, str(run_dir)],
                            capture_output=True, text=True, timeout=120, env=environment({}))
    assert result.returncode != 0 and "RunDirectoryError: cannot write checkpoints" in result.stderr, result.stderr


@pytest.mark.slow
def test_a_run_directory_that_cannot_be_locked_is_one_line(tmp_path):
    from tests.test_one_line_errors import environment, without_root_file_access

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o555)  # the directory exists (Hydra's log aside), but run.lock cannot be created in it
    lock = "import sys; from training.run_dir import RunDirectoryLock; RunDirectoryLock(sys.argv[1]).acquire()"
    result = subprocess.run([*without_root_file_access(), sys.executable, "-c", lock, str(run_dir)],
                            capture_output=True, text=True, timeout=120, env=environment({}))
    assert "RunDirectoryError: cannot lock" in result.stderr and "Permission denied" in result.stderr, result.stderr


@pytest.fixture
def small_file_system(tmp_path):
    """A real file system of 1 MB, a tmpfs, to fill (mounting needs root, as CI runs)."""
    mount_point = tmp_path / "full"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 1 MB tmpfs to fill (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def fill_up(mount_point: Path) -> None:
    """Leave no space on the file system at ``mount_point``: a ballast file takes all there is."""
    with open(mount_point / "ballast", "wb", buffering=0) as ballast, pytest.raises(OSError, match="No space left"):
        while True:
            ballast.write(b"\0" * 4096)
            ballast.flush()


@pytest.fixture
def full_file_system(small_file_system):
    """A real file system with no space left."""
    fill_up(small_file_system)
    return small_file_system


@pytest.mark.slow
def test_a_run_directory_on_a_full_file_system_is_one_line_naming_it_and_the_space(full_file_system):
    run_dir = full_file_system / "run"
    result = train(run_dir)
    assert_one_line_error(result, f"cannot lock {run_dir} (No space left on device)", "space")
    assert result.stderr.strip().splitlines()[-1].startswith("error: "), result.stderr


@pytest.mark.slow
def test_a_resume_refused_on_a_full_disk_leaves_nothing_in_the_run_directory(small_file_system):
    run_dir = small_file_system / "run"
    run_dir.mkdir()
    (run_dir / "run.lock").write_text("host h, pid 1, since 2026-01-01T00:00:00\n")  # the run before held it
    fill_up(small_file_system)
    for attempt in range(2):
        result = train(run_dir, "train.resume=true")
        assert_one_line_error(result, f"cannot write checkpoints to {checkpoint_dir(run_dir)} (No space left on "
                                      "device)")
        # Hydra's job log aside (opened before the run starts), the directory as it was: no probe, no checkpoints/.
        assert sorted(path.name for path in run_dir.iterdir()) == ["run.lock", "train.log"], attempt
        assert (run_dir / "run.lock").read_text() == "host h, pid 1, since 2026-01-01T00:00:00\n"


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_partial_file_left_by_a_killed_save_is_removed_at_start(tmp_path):
    assert train(tmp_path, "train.max_iters=2").returncode == 0
    partial = checkpoint_dir(tmp_path) / "ckpt_00000004.pt.tmp"
    partial.write_bytes(b"half a checkpoint")
    result = train(tmp_path, "train.resume=true")
    assert result.returncode == 0, result.stderr
    assert not partial.exists() and "a checkpoint save that never finished" in result.stdout


def leave_a_previous_run(run_dir):
    """What a run leaves behind: checkpoints (one set aside as unreadable), its log, a log set aside at a
    restart, the patch of a launch's uncommitted code, its offline wandb runs and its lines in Hydra's train.log."""
    save_checkpoint(run_dir, 8, {"step": 8}, keep=2)
    (checkpoint_dir(run_dir) / "ckpt_00000010.pt.unreadable").write_bytes(b"torn")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "metrics.before-restart-20260101-120000.jsonl").write_text('{"step": 0}\n')
    (run_dir / "code").mkdir()
    (run_dir / "code" / "launch_00000000.patch").write_text("diff --git a/train.py b/train.py\n")
    (run_dir / "wandb" / "offline-run-20260101_120000-abc").mkdir(parents=True)
    (run_dir / "wandb" / "offline-run-20260101_120000-abc" / "run-abc.wandb").write_bytes(b"records")
    (run_dir / "train.log").write_text("[old run] step 8\n")


def test_overwrite_deletes_every_record_of_the_previous_run_and_keeps_the_users_files(tmp_path):
    leave_a_previous_run(tmp_path)
    (tmp_path / "notes.txt").write_text("the user's own file")
    with pytest.raises(RunDirectoryError, match="train.overwrite=true"):
        claim_for_fresh_start(tmp_path, overwrite=False)
    hydra_log = open(tmp_path / "train.log", "a")  # Hydra opens it for the new run before the lock is taken
    claim_for_fresh_start(tmp_path, overwrite=True)
    hydra_log.write("[new run] step 0\n")
    hydra_log.close()
    assert list(checkpoint_dir(tmp_path).iterdir()) == []
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoints", "code", "notes.txt", "train.log"]
    assert list((tmp_path / "code").iterdir()) == []
    assert (tmp_path / "train.log").read_text() == "[new run] step 0\n"


@pytest.mark.parametrize("leftover", ["checkpoints/ckpt_00000010.pt.unreadable",
                                      "metrics.before-restart-20260101-120000.jsonl", "wandb/debug.log",
                                      "code/launch_00000000.patch"])
def test_a_fresh_start_is_refused_where_only_set_aside_records_of_a_run_are_left(tmp_path, leftover):
    (tmp_path / leftover).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / leftover).write_text("left by the previous run")
    with pytest.raises(RunDirectoryError, match="already holds a run"):
        claim_for_fresh_start(tmp_path, overwrite=False)


def test_logs_set_aside_by_resumes_whose_local_times_collide_are_all_kept(tmp_path, monkeypatch):
    """A run died before its first checkpoint and was resumed, twice: an hour apart, the second time one time zone
    further west (or across a DST fall-back), so that both logs were last written at the same local time."""
    first_written = datetime.datetime(2026, 10, 25, 1, 30, tzinfo=datetime.timezone.utc).timestamp()
    try:
        for zone, written, log in (("UTC0", first_written, '{"step": 1}\n'),
                                   ("UTC+1", first_written + 3600, '{"step": 2}\n'),  # UTC-1: same local time
                                   ("UTC+1", first_written + 3600, '{"step": 3}\n')):  # and the same second
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            (tmp_path / "metrics.jsonl").write_text(log)
            os.utime(tmp_path / "metrics.jsonl", (written, written))
            prepare_run_dir(tmp_path, resume=True, overwrite=False)
    finally:
        monkeypatch.undo()
        time.tzset()
    kept = sorted(path.read_text() for path in tmp_path.glob("metrics.before-restart-*.jsonl"))
    assert kept == ['{"step": 1}\n', '{"step": 2}\n', '{"step": 3}\n']


def test_resume_and_overwrite_together_are_refused_and_delete_nothing(tmp_path):
    leave_a_previous_run(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(RunDirectoryError, match="pick one"):
        prepare_run_dir(tmp_path, resume=True, overwrite=True)
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow
def test_a_full_disk_under_the_job_log_stops_the_run_with_one_line_and_keeps_its_checkpoint(tmp_path):
    assert train(tmp_path, "train.max_iters=2").returncode == 0
    saved = (checkpoint_dir(tmp_path) / "ckpt_00000002.pt").read_bytes()
    logged = read_metrics(tmp_path)
    (tmp_path / "train.log").unlink()
    (tmp_path / "train.log").symlink_to("/dev/full")  # every write to it fails with ENOSPC, as on a full disk
    result = train(tmp_path, "train.resume=true")
    assert_one_line_error(result, "could not write the job log", "train.log (No space left on device)",
                          "train.resume=true")
    assert result.stderr.count("could not write the job log") == 1 and "Logging error" not in result.stderr
    assert (checkpoint_dir(tmp_path) / "ckpt_00000002.pt").read_bytes() == saved
    assert read_metrics(tmp_path)[:len(logged)] == logged


@pytest.mark.slow
def test_a_full_disk_under_the_record_of_uncommitted_changes_stops_the_launch_with_one_line(tmp_path):
    # A checkout with an uncommitted change: each launch saves it as code/launch_<step>.patch in the run directory.
    copy = tmp_path / "checkout"
    copy_source_tree(copy)
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", "-C", str(copy)]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "checkout"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    schedule = copy / "training" / "schedule.py"
    schedule.write_text(schedule.read_text() + "# an uncommitted change\n")
    run_dir = tmp_path / "run"
    (run_dir / "code").mkdir(parents=True)
    (run_dir / "code" / "launch_00000000.patch.tmp").symlink_to("/dev/full")  # the patch's temporary file
    result = subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL], cwd=copy,
                            capture_output=True, text=True, timeout=600)
    assert_one_line_error(result, "could not save this launch's uncommitted changes",
                          "launch_00000000.patch (No space left on device)", "launch again")
    assert not list(checkpoint_dir(run_dir).glob("ckpt_*.pt"))  # it stopped before training


@pytest.mark.slow
def test_a_full_disk_as_a_resume_rewrites_the_metrics_log_stops_with_one_line_and_keeps_the_log(tmp_path):
    assert train(tmp_path, "train.max_iters=2").returncode == 0
    logged = (tmp_path / "metrics.jsonl").read_bytes()
    (tmp_path / "metrics.jsonl.tmp").symlink_to("/dev/full")  # the rewritten log's temporary file
    result = train(tmp_path, "train.resume=true")
    assert_one_line_error(result, "could not rewrite", "metrics.jsonl (No space left on device)", "train.resume=true")
    assert (tmp_path / "metrics.jsonl").read_bytes() == logged
