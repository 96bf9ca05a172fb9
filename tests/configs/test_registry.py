import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from configs.compose import register_configs, validate
from configs.registry import OPTIMIZERS, OptimizerEntry
from configs.schema import OptimizerConfig
from model import GPT, GPTConfig
from reporting.run_labels import optimizer_label, without_defaults
from training.optimizers import build_optimizer
from training.resume import state_defining_keys
from training.schedule import apply_schedule

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
OPTIMIZER_FILES = sorted(p.stem for p in Path(CONFIG_DIR, "optimizer").glob("*.yaml"))
register_configs()


def test_every_row_names_its_optimizer_by_its_schemas_name():
    assert all(issubclass(entry.schema, OptimizerConfig) and entry.schema.name == name
               for name, entry in OPTIMIZERS.items())


@pytest.mark.parametrize("file", OPTIMIZER_FILES)
def test_every_optimizer_config_has_a_registry_row_that_labels_it_and_names_only_its_own_keys(file):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"optimizer={file}"]).optimizer
    entry = OPTIMIZERS[cfg.name]
    assert OmegaConf.get_type(cfg) is entry.schema
    assert entry.label(cfg) in entry.labels or not entry.labels  # a display name (optimizer=external: its class)
    fields = {f.name for f in dataclasses.fields(entry.schema)}
    assert set(entry.state_keys) | set(entry.unread_keys(cfg)) | set(entry.schema.part_lrs) <= fields
    assert {f"optimizer.{key}" for key in entry.state_keys} <= set(state_defining_keys(cfg.name))


@dataclass
class SgdConfig(OptimizerConfig):
    """An optimizer this repository does not have, added as a new one would be: a schema and a registry row."""

    name: str = "sgd"
    momentum: float = 0.9


SGD = OptimizerEntry(SgdConfig, lambda cfg, device: (torch.optim.SGD, dict(lr=cfg.lr, momentum=cfg.momentum)),
                     labels={"sgd": "SGD"})


def test_an_optimizer_added_as_a_schema_and_a_registry_row_is_validated_built_scheduled_and_labelled(monkeypatch):
    monkeypatch.setitem(OPTIMIZERS, "sgd", SGD)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["model=tiny"])
    cfg.optimizer = OmegaConf.structured(SgdConfig(lr=0.1, momentum=0.5))
    validate(cfg)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    optimizer = build_optimizer(cfg.optimizer, model)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["momentum"] == 0.5
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.0, 0.0]  # nanoGPT's two groups
    schedule = dict(min_lr=0.01, warmup_iters=2, decay_iters=10, schedule=cfg.train.lr_schedule)
    assert apply_schedule(optimizer, 1, schedule, cfg.optimizer) == pytest.approx(0.05)
    saved = OmegaConf.to_container(cfg.optimizer)
    assert (optimizer_label(saved), without_defaults(saved)) == ("sgd", {"lr": 0.1, "momentum": 0.5})
