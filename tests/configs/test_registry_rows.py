"""What one registry row gives its optimizer: a config check that refuses bad values at start naming the key, and
train.* defaults that an experiment or the command line overrides."""
import copy
import dataclasses
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from configs.compose import CONFIG_DIR, compose_config, register_configs, validate
from configs.registry import OPTIMIZERS
from configs.schema import ConfigError, TrainConfig, require
from tests import warm_python
from tests.training.optimizer_configs import registered_configs

REPO = Path(__file__).resolve().parents[2]


def load(*overrides):
    return compose_config(list(overrides))


def out_of_range(key: str, value):
    """A value of optimizer.``key`` that the check every optimizer shares refuses by the key's name, or None."""
    if key.endswith(("betas", "betas_1d")):
        return [0.9, 1.5]
    named = key in ("lr", "momentum") or key.startswith("lr_") or key.endswith(
        ("eps", "weight_decay", "weight_decay_1d", "gamma", "_lr"))
    if named and isinstance(value, float):  # ns_steps ends in "eps" too
        return -1.0
    return None


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_bad_value_of_any_registered_optimizer_is_refused_by_the_config_check_naming_the_key(name):
    cfg = load(f"optimizer={registered_configs()[name]}")
    checked = {key: out_of_range(key, value) for key, value in cfg.optimizer.items()}
    checked = {key: bad for key, bad in checked.items() if bad is not None}
    assert "lr" in checked
    for key, bad in checked.items():
        changed = copy.deepcopy(cfg)
        changed.optimizer[key] = bad
        with pytest.raises(ConfigError, match=rf"optimizer\.{key}\b"):
            validate(changed)


def test_a_rows_own_check_refuses_its_bad_value_naming_the_key():
    with pytest.raises(ConfigError, match=r"optimizer\.mars_type"):
        validate(load("optimizer=mars-adamw", "optimizer.mars_type=mars-sgd"))


def refuse_a_schedule_a_second_warmup_and_float16(run):
    """A row's check of the config it trains under, as an optimizer with its own warmup and no schedule would."""
    require(run.train.lr_schedule == "constant", "train.lr_schedule=cosine: this optimizer needs no schedule, set "
            "train.lr_schedule=constant")
    require(run.train.warmup_iters == 0, "train.warmup_iters: this optimizer warms up itself, set it to 0")
    require(run.train.dtype != "float16", "train.dtype=float16: this optimizer needs bfloat16 or float32")


def test_a_rows_check_sees_the_whole_config_it_trains_under(monkeypatch):
    monkeypatch.setitem(OPTIMIZERS, "adamw", dataclasses.replace(OPTIMIZERS["adamw"],
                                                                 check=refuse_a_schedule_a_second_warmup_and_float16))
    fine = ["optimizer=adamw", "train.lr_schedule=constant", "train.warmup_iters=0"]
    validate(load(*fine))
    for override, key in (("train.lr_schedule=cosine", "train.lr_schedule"), ("train.warmup_iters=5",
                          "train.warmup_iters"), ("train.dtype=float16", "train.dtype")):
        with pytest.raises(ConfigError, match=rf"^{key}\b"):
            validate(load(*fine, override))
    validate(load("optimizer=mars-adamw"))  # another row's check: its own


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
    assert load("optimizer=mars-adamw").train.max_iters == TrainConfig.max_iters  # another optimizer: the schema's
    experiment = OmegaConf.load(Path(CONFIG_DIR, "experiment", "fwe-gpt2-small-50b-adamw.yaml"))
    assert load("experiment=fwe-gpt2-small-50b-adamw").train.max_iters == experiment.train.max_iters
