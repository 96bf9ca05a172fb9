"""A run killed at an arbitrary step resumes exactly: the same losses as the run that was never interrupted."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data.embedded import prepare_embedded
from data.shards import read_shard, write_shard
from reporting.run_reading import load_run
from training.checkpoint import latest_checkpoint
from training.metrics import LAUNCH_KEYS, read_metrics
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
         "train.eval_iters=2", "train.warmup_iters=2", "train.log_interval=1", "train.device=cpu",
         "train.max_iters=16", "train.eval_interval=4", "train.checkpoint_interval=4", "model.dropout=0.1"]


def command(run_dir, *overrides):
    return [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL, *overrides]


def complete_run(run_dir, *overrides, launcher=(sys.executable,)):
    result = warm_python.run([*launcher, *command(run_dir, *overrides)[1:]], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    return read_metrics(run_dir)


def start_and_wait_for_step(run_dir, step, *overrides, launcher=(sys.executable,)):
    return start_and_wait(run_dir, lambda records: any(r.get("step", 0) >= step and "train/loss" in r
                                                       for r in records), f"step {step}", *overrides, launcher=launcher)


def start_and_wait(run_dir, ready, awaited: str, *overrides, launcher=(sys.executable,)):
    """Start train.py into ``run_dir``; its process once ``ready(records of its metrics log)`` holds."""
    Path(run_dir).parent.mkdir(parents=True, exist_ok=True)
    # Output goes to a file: a pipe nobody reads while waiting could fill up and stall the run.
    output = Path(run_dir).parent / f"{Path(run_dir).name}.out"
    process = warm_python.start([*launcher, *command(run_dir, *overrides)[1:]], cwd=REPO, stdout=output)
    process.output = output
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if ready(read_metrics(run_dir)):
            return process
        if process.poll() is not None:
            raise AssertionError(f"train.py ended early: {read_output(process)}")
        time.sleep(0.02)
    process.kill()
    raise AssertionError(f"{awaited} not reached")


def read_output(process) -> str:
    return process.output.read_text()


def train_losses(records):
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return complete_run(tmp_path_factory.mktemp("uninterrupted"))


@pytest.mark.slow
def test_sigkill_at_an_arbitrary_step_then_resume_reproduces_the_uninterrupted_losses(tmp_path, uninterrupted):
    process = start_and_wait_for_step(tmp_path, 6)
    process.kill()
    process.wait()
    resumed = complete_run(tmp_path, "train.resume=true")
    # Bitwise on the CPU: same batches, same optimizer state, same dropout random stream.
    assert train_losses(resumed) == train_losses(uninterrupted)
    assert ([r["step"] for r in resumed if not LAUNCH_KEYS & r.keys()]
            == [r["step"] for r in uninterrupted if not LAUNCH_KEYS & r.keys()])


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR2])  # SIGUSR2: submitit's timeout signal
def test_sigterm_checkpoints_the_current_step_and_stops_cleanly(tmp_path, uninterrupted, signum):
    process = start_and_wait_for_step(tmp_path, 5)
    process.send_signal(signum)
    assert process.wait(timeout=120) == 0
    _, checkpoint = latest_checkpoint(tmp_path, "cpu")
    last_step = max(train_losses(read_metrics(tmp_path)))
    assert checkpoint["step"] == last_step < 16  # nothing past the last finished step is lost
    resumed = complete_run(tmp_path, "train.resume=true")
    assert train_losses(resumed) == train_losses(uninterrupted)


@pytest.mark.slow
def test_ctrl_c_during_an_evaluation_checkpoints_that_step_as_its_message_says_without_training_another(tmp_path):
    # Evaluations at steps 2, 4, ... of 100 batches a split, seconds long: the signal comes during the one of step
    # 2, whose training record is logged just before it; step 2 is no checkpoint step.
    process = start_and_wait_for_step(tmp_path, 2, "train.eval_interval=2", "train.eval_iters=100",
                                      "train.checkpoint_interval=100")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) == 0, read_output(process)
    assert "received SIGINT: finishing this step, then checkpointing and stopping" in read_output(process)
    _, checkpoint = latest_checkpoint(tmp_path, "cpu")
    assert checkpoint["step"] == 2 and max(train_losses(read_metrics(tmp_path))) == 2
    assert 2 in {r["step"] for r in read_metrics(tmp_path) if "val/loss" in r}  # the evaluation it interrupted ended


@pytest.mark.slow
def test_ctrl_c_during_the_step_0_evaluation_stops_at_step_0_and_the_resume_logs_that_evaluation_once(tmp_path):
    # The untrained model's evaluation, 100 batches a split, is seconds long; the launch's records are written just
    # before it starts. The run stops at step 0, as the signal's message says, and its resume equals a run never
    # stopped: the same losses, and one step-0 evaluation in the log, not two.
    slow_evaluation = ("train.eval_iters=100", "train.max_iters=4", "train.eval_interval=2")
    stopped = tmp_path / "stopped"
    process = start_and_wait(stopped, lambda records: any("launch" in r for r in records), "the launch's records",
                             *slow_evaluation)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=300) == 0, read_output(process)
    assert "received SIGINT: finishing this step, then checkpointing and stopping" in read_output(process)
    _, checkpoint = latest_checkpoint(stopped, "cpu")
    assert checkpoint["step"] == 0 and not train_losses(read_metrics(stopped))  # no step was trained
    assert [r["step"] for r in read_metrics(stopped) if "val/loss" in r] == [0]  # the evaluation it came in ended
    resumed = complete_run(stopped, *slow_evaluation, "train.resume=true")
    never_stopped = complete_run(tmp_path / "never_stopped", *slow_evaluation)
    assert train_losses(resumed) == train_losses(never_stopped)
    assert ([(r["step"], r["val/loss"]) for r in resumed if "val/loss" in r]
            == [(r["step"], r["val/loss"]) for r in never_stopped if "val/loss" in r])


def test_a_torn_last_metrics_line_is_ignored(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 2.0}) + '\n{"step": 2, "tra')
    assert read_metrics(tmp_path) == [{"step": 1, "train/loss": 2.0}]


@pytest.mark.slow
def test_torchrun_restarts_a_killed_worker_group_that_then_resumes_from_the_last_checkpoint(tmp_path):
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2")
    uninterrupted_ranks = complete_run(tmp_path / "uninterrupted", launcher=torchrun)
    restarted = tmp_path / "restarted"
    process = start_and_wait_for_step(restarted, 6, "train.resume=true", launcher=(*torchrun, "--max-restarts=1"))
    os.kill(worker_pids(restarted)[0], signal.SIGKILL)  # a worker dies; torchrun restarts the whole group
    assert process.wait(timeout=300) == 0, read_output(process)
    assert train_losses(read_metrics(restarted)) == train_losses(uninterrupted_ranks)


def worker_pids(run_dir) -> list[int]:
    """Processes running train.py into ``run_dir`` other than torchrun itself."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if f"hydra.run.dir={run_dir}".encode() in args and b"torch.distributed.run" not in args:
            pids.append(int(cmdline.parent.name))
    return pids


def interrupted_copy(uninterrupted_dir, tmp_path, name):
    """The uninterrupted run's directory as if killed after its step-8 checkpoint."""
    copy = tmp_path / name
    shutil.copytree(uninterrupted_dir, copy)
    for path in (copy / "checkpoints").glob("ckpt_*.pt"):
        if path.name != "ckpt_00000008.pt":
            path.unlink()
    return copy


@pytest.fixture(scope="module")
def uninterrupted_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("kept") / "run"
    complete_run(run_dir, "train.keep_checkpoints=4")
    return run_dir


# The lr is pinned down in test_resume_settings.py: here its change would move the losses even when ignored
# (the absolute min_lr changes the schedule's shape).
@pytest.mark.slow
@pytest.mark.parametrize("change, new_value", [("optimizer.gamma=0.2", 0.2),
                                               ("optimizer.betas=[0.5,0.5]", [0.5, 0.5]),
                                               ("optimizer.weight_decay=0.5", 0.5)])
def test_a_hyperparameter_changed_on_resume_takes_effect_and_is_recorded(tmp_path, uninterrupted_dir, change,
                                                                         new_value):
    resumed = interrupted_copy(uninterrupted_dir, tmp_path, "resumed")
    result = warm_python.run(command(resumed, "train.resume=true", "train.keep_checkpoints=4", change), cwd=REPO,
                             timeout=600)
    assert result.returncode == 0, result.stderr
    key = change.split("=")[0]
    assert f"changed on resume: {key}" in result.stdout
    records = read_metrics(resumed)
    before, after = train_losses(read_metrics(uninterrupted_dir)), train_losses(records)
    assert {s: after[s] for s in after if s <= 8} == {s: before[s] for s in before if s <= 8}
    # The checkpoint's hyperparameters used to win over the configured ones: the losses would not move.
    assert all(after[s] != before[s] for s in range(10, 17)), change
    event = next(r for r in records if "changed" in r)
    assert event["step"] == 8 and list(event["changed"]) == [key]
    assert event["changed"][key][1] == new_value


@pytest.mark.slow
def test_shards_swapped_behind_an_unchanged_data_dir_are_told_and_recorded_as_changed_data(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    shutil.copytree(prepare_embedded(), first)
    second.mkdir()  # another corpus: half the first one's training tokens, in two shards, no manifest
    for k, piece in enumerate(np.array_split(np.array(read_shard(first / "train.bin"))[:700_000], 2)):
        write_shard(second / f"train_{k:06d}.bin", piece)
    shutil.copy(first / "val.bin", second / "val.bin")
    data_dir = tmp_path / "data"
    data_dir.symlink_to(first)
    run_dir, data = tmp_path / "run", ["data=custom", f"data.dir={data_dir}", "train.keep_checkpoints=4"]
    complete_run(run_dir, *data)
    interrupted = interrupted_copy(run_dir, tmp_path, "interrupted")
    data_dir.unlink()
    data_dir.symlink_to(second)  # re-pointed before the resume; the config is the same
    result = warm_python.run(command(interrupted, *data, "train.resume=true"), cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "changed on resume: data 'train 1,4" in result.stdout and "-> 'train 700,000 tokens in 2 shard(s)" in (
        result.stdout), result.stdout
    event = next(r for r in read_metrics(interrupted) if "changed" in r)
    assert event["step"] == 8 and list(event["changed"]) == ["data"]
    assert load_run(interrupted).setting != load_run(run_dir).setting  # a setting of its own for the tables


@pytest.mark.slow
@pytest.mark.parametrize("change, key", [
    ("model.n_embd=64", "model.n_embd"),
    ("model.vocab_size=50257", "model.vocab_size"),
    ("optimizer=adamw", "optimizer.name"),
    ("optimizer.mars_type=mars-lion", "optimizer.mars_type"),
    ("optimizer.is_approx=false", "optimizer.is_approx"),
])
def test_a_resume_that_would_make_the_state_meaningless_stops_naming_the_key(tmp_path, uninterrupted_dir, change,
                                                                            key):
    resumed = interrupted_copy(uninterrupted_dir, tmp_path, "resumed")
    record_before = run_record(resumed)
    result = warm_python.run(command(resumed, "train.resume=true", change), cwd=REPO, timeout=600)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"with a changed {key} (checkpoint" in result.stderr
    assert run_record(resumed) == record_before  # the run is not relabelled with the refused config


def run_record(run_dir) -> dict[str, str]:
    """What labels a run for the table and plot scripts: its log and its .hydra/ record."""
    return {name: (Path(run_dir) / name).read_text()
            for name in ("metrics.jsonl", ".hydra/config.yaml", ".hydra/overrides.yaml")}


@pytest.mark.slow
def test_resuming_a_finished_run_trains_nothing_and_leaves_its_record_as_it_was(tmp_path, uninterrupted_dir):
    finished = tmp_path / "finished"
    shutil.copytree(uninterrupted_dir, finished)
    record_before = run_record(finished)
    result = warm_python.run(command(finished, "train.resume=true", "optimizer.gamma=0.2", "train.seed=5"), cwd=REPO,
                             timeout=600)
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stdout and "were not applied" in result.stdout
    assert run_record(finished) == record_before


@pytest.mark.slow
def test_a_state_gone_non_finite_is_never_checkpointed(tmp_path):
    # Warmup from lr 0: the first step leaves finite weights, the second one (lr 5e299) overflows them.
    small = [arg for arg in command(tmp_path, "optimizer.lr=1e300") if not arg.startswith("train.checkpoint_interval=")]
    result = warm_python.run([*small, "train.checkpoint_interval=1", "train.keep_checkpoints=1"], cwd=REPO,
                             timeout=600)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "diverged at step 2: non-finite values in the state after the step (model " in result.stderr
    assert "Its checkpoint is not written, so that no resume starts from it." in result.stderr
    assert "last good checkpoint: " in result.stderr and "ckpt_00000001.pt" in result.stderr
    path, checkpoint = latest_checkpoint(tmp_path, "cpu")
    assert path.name == "ckpt_00000001.pt"  # still there: pruning never ran for the refused one
    assert all(tensor.isfinite().all() for tensor in checkpoint["model"].values())


@pytest.mark.slow
def test_ctrl_c_in_a_local_sweep_checkpoints_the_running_point_and_starts_no_other(tmp_path):
    sweep = tmp_path / "sweep"
    process = warm_python.start([sys.executable, "train.py", "-m", f"hydra.sweep.dir={sweep}", *SMALL,
                                 "optimizer.lr=1e-3,3e-3"], cwd=REPO, stdout=tmp_path / "sweep.out")
    deadline = time.monotonic() + 300
    while not any(r.get("step", 0) >= 5 and "train/loss" in r for d in sweep.glob("0_*") for r in read_metrics(d)):
        assert process.poll() is None and time.monotonic() < deadline, "the sweep's first point did not reach step 5"
        time.sleep(0.02)
    process.send_signal(signal.SIGINT)
    returncode = process.wait(timeout=300)
    log = (tmp_path / "sweep.out").read_text()
    assert returncode != 0 and "no further point starts" in log and f"bash {sweep}/resume.sh" in log, log
    first, = sweep.glob("0_*")
    _, checkpoint = latest_checkpoint(first, "cpu")
    assert checkpoint["step"] == max(train_losses(read_metrics(first))) < 16  # stopped cleanly, nothing lost
    assert not any(sweep.glob("1_*"))


@pytest.mark.slow
def test_a_resume_with_every_checkpoint_unreadable_stops_naming_them_and_keeps_the_log(tmp_path, uninterrupted_dir):
    resumed = interrupted_copy(uninterrupted_dir, tmp_path, "resumed")
    (resumed / "checkpoints" / "ckpt_00000008.pt").write_bytes(b"torn")
    (resumed / "checkpoints" / "ckpt_00000004.pt").write_bytes(b"")
    record_before = run_record(resumed)
    result = warm_python.run(command(resumed, "train.resume=true"), cwd=REPO, timeout=600)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "none of the 2 checkpoints" in result.stderr and "ckpt_00000004.pt, " not in result.stderr
    assert "ckpt_00000008.pt, ckpt_00000004.pt" in result.stderr
    assert run_record(resumed) == record_before


@pytest.mark.slow
def test_a_resume_without_checkpoint_keeps_the_earlier_log_aside_and_starts_over(tmp_path, uninterrupted_dir):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    earlier = (uninterrupted_dir / "metrics.jsonl").read_text()
    (run_dir / "metrics.jsonl").write_text(earlier)
    complete_run(run_dir, "train.resume=true")
    kept = list(run_dir.glob("metrics.before-restart-*.jsonl"))
    assert len(kept) == 1 and kept[0].read_text() == earlier
    assert train_losses(read_metrics(run_dir)) == train_losses(read_metrics(uninterrupted_dir))


@pytest.mark.slow
def test_a_resume_past_an_unreadable_newest_checkpoint_sets_it_aside_so_pruning_keeps_the_new_ones(tmp_path,
                                                                                                 uninterrupted_dir):
    resumed = interrupted_copy(uninterrupted_dir, tmp_path, "resumed")
    (resumed / "checkpoints" / "ckpt_00000004.pt").write_bytes(
        (uninterrupted_dir / "checkpoints" / "ckpt_00000004.pt").read_bytes())
    (resumed / "checkpoints" / "ckpt_00000020.pt").write_bytes(b"torn")
    # keep_checkpoints=1: pruning by step number would delete each new checkpoint and keep the torn step 20.
    complete_run(resumed, "train.resume=true", "train.keep_checkpoints=1", "train.checkpoint_interval=2")
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == ["ckpt_00000016.pt",
                                                                             "ckpt_00000020.pt.unreadable"]
    assert latest_checkpoint(resumed, "cpu")[1]["step"] == 16
    assert train_losses(read_metrics(resumed)) == train_losses(read_metrics(uninterrupted_dir))


AUTHORS_DRAWS = ["data.draws=authors", "train.eval_sampling=fresh", "train.keep_checkpoints=4"]


def losses(records) -> dict[int, dict]:
    """Every loss a run logged, by step: the training loss, and at evaluations the estimates."""
    keys = ("train/loss", "val/loss", "val/loss_fixed", "train/loss_estimate")
    return {r["step"]: {key: r[key] for key in keys if key in r} for r in records if keys[0] in r or keys[1] in r}


@pytest.mark.slow
def test_a_run_resumed_under_the_authors_draws_logs_the_uninterrupted_runs_losses(tmp_path):
    uninterrupted_dir = tmp_path / "uninterrupted"
    uninterrupted = complete_run(uninterrupted_dir, *AUTHORS_DRAWS)
    resumed = interrupted_copy(uninterrupted_dir, tmp_path, "resumed")  # as if killed after step 8
    (resumed / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in uninterrupted if r["step"] <= 8 and not LAUNCH_KEYS & r.keys()))
    # Their trainer would reseed here and draw its first windows again; ours draws on as if never stopped.
    assert losses(complete_run(resumed, *AUTHORS_DRAWS, "train.resume=true")) == losses(uninterrupted)


@pytest.mark.slow
def test_a_checkpoint_without_the_authors_draws_is_not_resumed_under_them(tmp_path, uninterrupted_dir):
    resumed = interrupted_copy(uninterrupted_dir, tmp_path, "resumed")
    result = warm_python.run(command(resumed, "train.resume=true", *AUTHORS_DRAWS), cwd=REPO, timeout=600)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "it was written under data.draws=keyed" in result.stderr and "Resume with data.draws=keyed" in result.stderr


# llama-tiny in miniature; no dropout (the LLaMA model has none: SMALL's is undone).
LLAMA = ["model=llama-tiny", "model.n_layer=1", "model.n_embd=32", "model.intermediate_size=64", "model.dropout=0.0"]


@pytest.mark.slow
def test_a_llama_run_checkpoints_and_its_resume_logs_the_uninterrupted_runs_losses(tmp_path):
    uninterrupted_dir = tmp_path / "uninterrupted"
    uninterrupted = complete_run(uninterrupted_dir, *LLAMA, "train.keep_checkpoints=4")
    resumed = interrupted_copy(uninterrupted_dir, tmp_path, "resumed")  # as if killed after step 8
    (resumed / "metrics.jsonl").write_text("".join(
        json.dumps(r) + "\n" for r in uninterrupted if r["step"] <= 8 and not LAUNCH_KEYS & r.keys()))
    assert losses(complete_run(resumed, *LLAMA, "train.resume=true")) == losses(uninterrupted)
    assert load_run(resumed).model == "llama-1x32"
