"""The configs of configs/optimizer/, read for the tests that run every registered optimizer."""
from pathlib import Path

from omegaconf import OmegaConf

from configs.compose import CONFIG_DIR


def registered_configs() -> dict[str, str]:
    """The first config of configs/optimizer/ (in sorted order) of each registered optimizer, by the optimizer's
    name: each YAML types itself with its row's ``/optimizer_<name>_schema``."""
    configs = {}
    for path in sorted(Path(CONFIG_DIR, "optimizer").glob("*.yaml")):
        row = OmegaConf.load(path).defaults[0].split("@")[0].removeprefix("/optimizer_").removesuffix("_schema")
        configs.setdefault(row, path.stem)
    return configs
