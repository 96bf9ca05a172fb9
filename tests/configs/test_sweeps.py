"""Multirun sweeps (`python train.py -m key=a,b ...`): one run directory per point, named by its overrides."""
import json
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from configs.compose import register_configs
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
TINY = ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "train.batch_size=2", "train.block_size=16",
        "train.max_iters=2", "train.eval_interval=2", "train.eval_iters=1", "train.warmup_iters=0",
        "train.device=cpu"]
register_configs()


def job_config(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def run_sweep(sweep_dir: Path, *overrides: str) -> list[Path]:
    """``train.py -m optimizer.gamma=0.01,0.05`` on the tiny model; the run directories, in sweep order."""
    result = warm_python.run([sys.executable, "train.py", "-m", "optimizer.gamma=0.01,0.05", *TINY, *overrides,
                              f"hydra.sweep.dir={sweep_dir}"], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dirs = sorted(path for path in sweep_dir.iterdir() if path.is_dir() and not path.name.startswith("."))
    assert [path.name.split("_")[0] for path in run_dirs] == ["0", "1"]
    for run_dir, gamma in zip(run_dirs, (0.01, 0.05)):
        assert f"optimizer.gamma={gamma}" in run_dir.name
        assert OmegaConf.load(run_dir / ".hydra" / "config.yaml").optimizer.gamma == gamma
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "val/loss" in r] == [0, 2]
    return run_dirs


@pytest.mark.slow
def test_local_sweep_writes_one_run_directory_per_point_with_its_config_and_metrics(tmp_path):
    run_sweep(tmp_path)


@pytest.mark.slow
def test_submitit_runs_each_sweep_point_as_one_job_of_two_ranks(tmp_path):
    # The SLURM recipe on one machine: submitit's local executor starts two tasks per job, the callback turns
    # them into ranks 0 and 1, and the two ranks train one run together (Gloo on the CPU).
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    run_dirs = run_sweep(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                         "+hydra.callbacks.torch_distributed._target_=training.launcher.TorchDistributedFromSubmitit")
    for run_dir in run_dirs:
        step = next(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                    if "train/loss" in json.loads(line))
        assert step["tokens"] == 2 * 2 * 2 * 16  # 2 steps x 2 ranks x batch 2 x block 16


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=submitit_local"]], ids=["local", "submitit"])
def test_a_sweep_claims_its_own_directory_and_every_point_lands_in_it(tmp_path, launcher):
    # Two sweeps started in the same second used to share multirun/<date>/<time>, mixing their runs. The default
    # is checked here; the runs claim under tmp_path instead of the repository's multirun/.
    assert OmegaConf.to_container(job_config().hydra.sweep)["dir"] == "${unique_run_dir:multirun}"  # unresolved
    if launcher:
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    parent = tmp_path / "multirun"
    for _ in range(2):
        result = warm_python.run([sys.executable, "train.py", "-m", "optimizer.gamma=0.01,0.05", *TINY, *launcher,
                                  f"hydra.sweep.dir=${{unique_run_dir:{parent}}}"], cwd=REPO, timeout=600)
        assert result.returncode == 0, result.stdout + result.stderr
    # Each launch claimed one sweep directory (the jobs of a submitit sweep, in other processes, find the one
    # their launcher claimed) holding both of its points.
    sweeps = sorted(parent.glob("*/*"))
    assert len(sweeps) == 2
    for sweep in sweeps:
        points = sorted(path.parent.name.split("_")[0] for path in sweep.glob("*/metrics.jsonl"))
        assert points == ["0", "1"], sweep


def test_sweep_directory_names_leave_out_paths_and_resume_flags():
    # A path would nest directories; resume must find the directories the first launch made.
    cfg = job_config("data=custom", "data.dir=/shards/mine", "train.resume=true", "optimizer.gamma=0.01")
    assert cfg.hydra.job.override_dirname == "data=custom,optimizer.gamma=0.01"


def test_slurm_launcher_submits_one_job_per_point_with_one_task_per_gpu():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = job_config("hydra/launcher=slurm", "experiment=owt-gpt2-small-5b-mars-approx")
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    assert launcher.tasks_per_node == launcher.gpus_per_node == 8 and launcher.nodes == 1
    assert launcher.gpus_per_task is None  # every task sees all GPUs of its node and takes cuda:LOCAL_RANK
    assert cfg.hydra.callbacks.torch_distributed._target_ == "training.launcher.TorchDistributedFromSubmitit"


def test_local_runs_have_no_slurm_callback():
    assert "torch_distributed" not in job_config().hydra.callbacks
