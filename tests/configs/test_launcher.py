"""Each SLURM task of a submitit job becomes a torch.distributed rank with torchrun's environment variables."""
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from configs.launcher import TORCHRUN_VARIABLES, TorchDistributedFromSubmitit

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


@pytest.mark.slow
def test_the_local_launcher_runs_each_sweep_point_as_two_ranks_and_records_its_overrides(tmp_path):
    # hydra/launcher=local: submitit's local executor, two tasks per point, the same callback as on SLURM.
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    repo = Path(__file__).resolve().parents[2]
    small = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
             "train.eval_iters=2", "train.warmup_iters=1", "train.device=cpu", "train.max_iters=1"]
    result = subprocess.run([sys.executable, "train.py", "-m", "hydra/launcher=local",
                             f"hydra.sweep.dir={tmp_path}", *small, "optimizer=adamw,mars-adamw"],
                            cwd=repo, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    launches = {}
    for metrics in tmp_path.glob("*/metrics.jsonl"):
        for line in metrics.read_text().splitlines():
            if '"launch"' in line:
                launch = json.loads(line)["launch"]
                launches[launch["command"][-1]] = launch
    assert sorted(launches) == ["optimizer=adamw", "optimizer=mars-adamw"]  # not submitit's .submitit/%j
    assert all(launch["world_size"] == 2 and launch["command"] == [*small, name]
               for name, launch in launches.items())
