"""The run config (configs/config.yaml plus overrides) composed outside train.py's Hydra app: for scripts."""
from pathlib import Path

from hydra import compose, initialize_config_dir

from configs.schema import register_configs

CONFIG_DIR = Path(__file__).resolve().parent


def compose_config(overrides: list[str]):
    """The config train.py would run with these command-line overrides (not yet validated)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))
