from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException

from configs.compose import register_configs, validate
from configs.schema import ConfigError, Sampling

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
register_configs()


def load(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("name", ["embedded", "openwebtext", "fineweb-edu"])
def test_named_corpora_compose_with_their_default_location(name):
    cfg = load(f"data={name}")
    assert cfg.data.name == name and cfg.data.dir is None and cfg.data.sampling == Sampling.random
    validate(cfg)


def test_custom_data_takes_a_directory_and_a_sampling_mode():
    cfg = load("data=custom", "data.dir=/shards", "data.sampling=sequential")
    assert (cfg.data.dir, cfg.data.sampling) == ("/shards", Sampling.sequential)
    validate(cfg)


def test_custom_data_without_a_directory_is_rejected_naming_the_key():
    with pytest.raises(ConfigError, match=r"data\.dir"):
        validate(load("data=custom"))


def test_unknown_sampling_mode_is_rejected():
    with pytest.raises(ConfigCompositionException):
        load("data.sampling=shuffled")
