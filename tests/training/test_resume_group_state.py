"""A resume restores the param-group keys the config sets and leaves the optimizer's own state kept in its groups
(schedule-free AdamW's ``k`` and ``weight_sum``) as the checkpoint saved it."""
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from configs.compose import register_configs
from configs.registry import param_groups
from model import build_model, model_config
from training.distributed import DistributedContext
from training.optimizers import build_optimizer
from training.resume import resume_from
from training.runtime import rng_state

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
register_configs()


class CountingAdamW(torch.optim.AdamW):
    """AdamW that counts its steps in each param group, where schedule-free AdamW keeps its ``k``."""

    def add_param_group(self, param_group):
        super().add_param_group({**param_group, "steps_taken": 0})

    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            group["steps_taken"] += 1
        return loss


def config(weight_decay):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["optimizer=adamw", f"optimizer.weight_decay={weight_decay}",
                                                       "model.n_layer=1", "model.n_head=2", "model.n_embd=16",
                                                       "model.vocab_size=64", "model.block_size=8"])
    return cfg


def counting_adamw(cfg):
    torch.manual_seed(0)
    model = build_model(model_config(OmegaConf.to_container(cfg.model)))
    groups = param_groups(model, cfg.optimizer.weight_decay, cfg.optimizer.decay_embeddings)
    return model, CountingAdamW(groups, lr=cfg.optimizer.lr, betas=tuple(cfg.optimizer.betas))


def test_a_counter_kept_in_the_param_groups_survives_a_resume_that_changes_a_configured_key():
    saved_cfg = config(0.1)
    model, optimizer = counting_adamw(saved_cfg)
    for _ in range(3):
        idx = torch.randint(0, 64, (2, 8))
        model(idx, idx)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3, "tokens": 0,
                  "rng": [rng_state()], "config": OmegaConf.to_container(saved_cfg, resolve=True, enum_to_str=True)}

    cfg = config(0.2)
    model, optimizer = counting_adamw(cfg)
    changes = resume_from(checkpoint, Path("ckpt_00000003.pt"), OmegaConf.to_container(cfg, resolve=True),
                          model, optimizer, DistributedContext())
    assert [group["steps_taken"] for group in optimizer.param_groups] == [3, 3]
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.2, 0.0]
    assert changes["optimizer.weight_decay"] == (0.1, 0.2)


def test_a_resume_that_changes_lr_1d_steps_at_the_configured_ratio_not_the_checkpoints():
    # MARS keeps lr_1d as the group's ratio to lr (lr_1d_ratio): a configured setting, as lr_1d itself.
    def mars(lr_1d):
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            cfg = compose(config_name="config", overrides=["optimizer=mars-adamw", f"optimizer.lr_1d={lr_1d}",
                                                           "model.n_layer=1", "model.n_head=2", "model.n_embd=16",
                                                           "model.vocab_size=64", "model.block_size=8"])
        torch.manual_seed(0)
        model = build_model(model_config(OmegaConf.to_container(cfg.model)))
        return cfg, model, build_optimizer(cfg.optimizer, model)

    saved_cfg, model, optimizer = mars(3e-3)
    checkpoint = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3, "tokens": 0,
                  "rng": [rng_state()], "config": OmegaConf.to_container(saved_cfg, resolve=True, enum_to_str=True)}
    cfg, model, optimizer = mars(1e-3)
    changes = resume_from(checkpoint, Path("ckpt_00000003.pt"), OmegaConf.to_container(cfg, resolve=True),
                          model, optimizer, DistributedContext())
    assert changes["optimizer.lr_1d"] == (3e-3, 1e-3)
    assert [group["lr_1d_ratio"] for group in optimizer.param_groups] == [1e-3 / cfg.optimizer.lr] * 2
