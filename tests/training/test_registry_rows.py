"""What one registry row gives its optimizer: a config check that refuses bad values at start naming the key, and
train.* defaults that an experiment or the command line overrides."""
import dataclasses
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from configs.compose import CONFIG_DIR, compose_config
from configs.schema import ConfigError, register_configs, validate
from training.registry import OPTIMIZERS
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]


def load(*overrides):
    return compose_config(list(overrides))


@pytest.mark.parametrize("overrides, key", [
    (["optimizer=adamw", "optimizer.betas=[0.9,1.5]"], "optimizer.betas"),
    (["optimizer=mars-adamw", "optimizer.betas_1d=[-0.1,0.9]"], "optimizer.betas_1d"),
    (["optimizer=mars-adamw", "optimizer.gamma=-0.5"], "optimizer.gamma"),
    (["optimizer=adamw", "optimizer.eps=-1e-8"], "optimizer.eps"),
    (["optimizer=muon", "optimizer.momentum=1.0"], "optimizer.momentum"),
    (["optimizer=muon", "optimizer.adamw_eps=-1.0"], "optimizer.adamw_eps"),
    (["optimizer=mars-m", "optimizer.adamw_betas=[0.9,1.0]"], "optimizer.adamw_betas"),
    (["optimizer=mars-adamw", "optimizer.mars_type=mars-sgd"], "optimizer.mars_type"),
])
def test_a_bad_optimizer_value_is_refused_by_the_config_check_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(load(*overrides))


@pytest.mark.slow
def test_a_launch_with_bad_betas_stops_with_one_line_naming_the_key_before_any_data_loads(tmp_path):
    run_dir = tmp_path / "run"
    launch = warm_python.run([sys.executable, "train.py", "optimizer=adamw", "optimizer.betas=[0.9,1.5]",
                              f"hydra.run.dir={run_dir}"], cwd=REPO, timeout=300)
    assert launch.returncode != 0 and "Traceback" not in launch.stderr, launch.stderr
    output = (launch.stdout + launch.stderr).strip().splitlines()
    assert output == ["error: optimizer.betas must be a pair [beta1, beta2] with 0 <= beta < 1, got [0.9, 1.5]"]
    assert not (run_dir / "checkpoints").exists()  # refused before the run was set up and its data read


@pytest.fixture
def adamw_row_with_train_defaults(monkeypatch):
    row = dataclasses.replace(OPTIMIZERS["adamw"], train_defaults={"max_iters": 7, "warmup_iters": 3})
    monkeypatch.setitem(OPTIMIZERS, "adamw", row)
    register_configs()
    yield
    monkeypatch.undo()
    register_configs()


def test_a_rows_train_defaults_apply_and_an_override_or_experiment_wins(adamw_row_with_train_defaults):
    train = load("optimizer=adamw").train
    assert (train.max_iters, train.warmup_iters) == (7, 3)
    train = load("optimizer=adamw", "train.max_iters=11").train
    assert (train.max_iters, train.warmup_iters) == (11, 3)
    assert load("optimizer=mars-adamw").train.max_iters == 250  # the schema's default: another optimizer's row
    experiment = OmegaConf.load(Path(CONFIG_DIR, "experiment", "fwe-gpt2-small-50b-adamw.yaml"))
    assert load("experiment=fwe-gpt2-small-50b-adamw").train.max_iters == experiment.train.max_iters
