"""Each SLURM task of a submitit job becomes a torch.distributed rank with torchrun's environment variables."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest

from training.launcher import TORCHRUN_VARIABLES, TorchDistributedFromSubmitit
from tests import warm_python

# Task 11 of a 2-node job with 8 tasks per node, as srun describes it to the process.
SLURM_TASK = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "16",
              "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "gpu[07-08]",
              "SLURM_PROCID": "11", "SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.fixture
def slurm_task():
    """The environment of that task; everything the callback exports is gone after the test."""
    pytest.importorskip("submitit")
    with mock.patch.dict(os.environ, SLURM_TASK):
        for key in TORCHRUN_VARIABLES:
            os.environ.pop(key, None)
        yield os.environ


def test_slurm_task_gets_torchrun_variables(slurm_task):
    TorchDistributedFromSubmitit().on_job_start(config=None)
    exported = {key: os.environ[key] for key in TORCHRUN_VARIABLES}
    port = exported.pop("MASTER_PORT")
    assert exported == {"RANK": "11", "LOCAL_RANK": "3", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8",
                        "MASTER_ADDR": "gpu07"}
    assert 1024 <= int(port) < 65536
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_every_task_of_a_job_agrees_on_the_rendezvous(slurm_task):
    TorchDistributedFromSubmitit().on_job_start(config=None)
    first = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    for key in TORCHRUN_VARIABLES:
        del slurm_task[key]
    slurm_task.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0")
    TorchDistributedFromSubmitit().on_job_start(config=None)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == first
    assert os.environ["RANK"] == "0"


def test_a_job_under_torchrun_keeps_its_variables(slurm_task):
    slurm_task["RANK"] = "5"
    TorchDistributedFromSubmitit().on_job_start(config=None)
    assert os.environ["RANK"] == "5" and "WORLD_SIZE" not in os.environ


def test_outside_slurm_nothing_is_exported(slurm_task):
    del slurm_task["SUBMITIT_EXECUTOR"]
    TorchDistributedFromSubmitit().on_job_start(config=None)
    assert not any(key in os.environ for key in TORCHRUN_VARIABLES)


REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
         "train.eval_iters=2", "train.warmup_iters=1", "train.device=cpu"]


def local_sweep(sweep_dir: Path, *overrides: str) -> list[str]:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    return [sys.executable, "train.py", "-m", "hydra/launcher=local", f"hydra.sweep.dir={sweep_dir}", *SMALL,
            *overrides]


def launch_records(metrics: Path) -> list[dict]:
    return [json.loads(line)["launch"] for line in metrics.read_text().splitlines() if '"launch"' in line]


@pytest.mark.slow
def test_the_local_launcher_runs_each_sweep_point_as_two_ranks_and_records_its_overrides(tmp_path):
    # hydra/launcher=local: submitit's local executor, two tasks per point, the same callback as on SLURM.
    result = warm_python.run(local_sweep(tmp_path, "train.max_iters=1", "optimizer=adamw,mars-adamw"), cwd=REPO,
                             timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    launches = {launch["command"][-1]: launch for metrics in tmp_path.glob("*/metrics.jsonl")
                for launch in launch_records(metrics)}
    assert sorted(launches) == ["optimizer=adamw", "optimizer=mars-adamw"]  # not submitit's .submitit/%j
    assert all(launch["world_size"] == 2 and launch["command"] == [*SMALL, "train.max_iters=1", name]
               for name, launch in launches.items())


@pytest.mark.slow
def test_submitits_timeout_signal_checkpoints_the_step_then_the_requeued_job_resumes_there(tmp_path):
    # SIGUSR2 to both tasks, as SLURM sends it before a time limit: the ranks checkpoint the current step (no
    # periodic checkpoint before the end), submitit requeues, and the job resumes from that step.
    command = local_sweep(tmp_path, "train.max_iters=40", "train.log_interval=1", "train.eval_interval=100",
                          "train.checkpoint_interval=1000", "train.resume=true", "optimizer=adamw")
    sweep = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not any('"step": 5,' in path.read_text() for path in tmp_path.glob("*/metrics.jsonl")):
            assert time.monotonic() < deadline and sweep.poll() is None, "the sweep point never reached step 5"
            time.sleep(0.1)
        tasks = [int(proc.name) for proc in Path("/proc").iterdir() if proc.name.isdigit()
                 and f"submitit.core._submit\0{tmp_path}".encode() in read_cmdline(proc)]
        assert len(tasks) == 2
        for pid in tasks:
            os.kill(pid, signal.SIGUSR2)
        assert sweep.wait(timeout=600) == 0
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
    [metrics] = tmp_path.glob("*/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    first, requeued = [r["step"] for r in records if "launch" in r]
    assert first == 0 and 5 <= requeued < 40  # the requeued job started from the step the signal came at
    assert sorted(path.name for path in (metrics.parent / "checkpoints").glob("ckpt_*.pt")) == [
        f"ckpt_{requeued:08d}.pt", "ckpt_00000040.pt"]
    assert max(r["step"] for r in records if "train/loss" in r) == 40


def read_cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:  # the process ended meanwhile
        return b""
