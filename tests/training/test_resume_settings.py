"""What a resume does with settings that differ from the checkpoint's: configured hyperparameters win, and keys
that define the state are refused by name."""
import dataclasses
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from configs.compose import register_configs
from configs.registry import OPTIMIZERS as REGISTRY
from configs.schema import LrSchedule, ModelConfig
from model import build_model, model_config
from training import resume
from training.checkpoint import CheckpointReadError, save_checkpoint
from training.distributed import DistributedContext
from training.optimizers import build_optimizer
from training.eval_weights import start_training
from training.resume import (ResumeRefused, check_resumable, config_changes, configured_keys, resume_from,
                             state_defining_keys)
from training.runtime import rng_state
from training.schedule import apply_schedule, learning_rate

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
OPTIMIZERS = sorted(p.stem for p in Path(CONFIG_DIR, "optimizer").glob("*.yaml"))
SCHEDULE = dict(min_lr=1e-4, warmup_iters=2, decay_iters=20, schedule="cosine", decay_fraction=0.2)
register_configs()


def composed(*overrides):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["model.n_layer=1", "model.n_head=2", "model.n_embd=16",
                                                       "model.vocab_size=64", "model.block_size=8", *overrides])
    return cfg


def trained_checkpoint(cfg, steps=3, keep_optimizer=False):
    """A checkpoint as train.py writes it, after ``steps`` scheduled steps of ``cfg`` (``keep_optimizer``: the
    optimizer then)."""
    torch.manual_seed(0)
    model = build_model(model_config(OmegaConf.to_container(cfg.model)))
    optimizer = build_optimizer(cfg.optimizer, model)
    start_training(optimizer)
    for step in range(steps):
        apply_schedule(optimizer, step, SCHEDULE, cfg.optimizer)
        idx = torch.randint(0, 64, (2, 8))
        model(idx, idx)[1].backward()
        if getattr(optimizer, "needs_lookahead_grad", False):
            optimizer.stash_lookahead_grad()
        optimizer.step()
        optimizer.zero_grad()
    if keep_optimizer:
        return optimizer
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": steps, "tokens": 0,
            "rng": [rng_state()], "config": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)}


def resumed(cfg, checkpoint):
    model = build_model(model_config(OmegaConf.to_container(cfg.model)))
    optimizer = build_optimizer(cfg.optimizer, model)
    start_training(optimizer)
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    changes = resume_from(checkpoint, Path("ckpt_00000003.pt"), config, model, optimizer, DistributedContext())
    return optimizer, changes


def hyperparameters(optimizer):
    """Each group's keys as the config sets them: not the schedule's peak_lr nor the optimizer's state kept there."""
    configured = configured_keys(type(optimizer))
    return [{key: value for key, value in group.items() if key in configured} for group in optimizer.param_groups]


def group_state(optimizer):
    """Each group's keys the optimizer keeps as its state (schedule-free's k, weight_sum, ...)."""
    kept = configured_keys(type(optimizer)) | {"params", "peak_lr"}
    return [{key: value for key, value in group.items() if key not in kept} for group in optimizer.param_groups]


# Every config, and an installed optimizer that keeps counters in its groups (schedulefree's k, weight_sum, lr_max).
CONFIGS = [[f"optimizer={name}"] for name in OPTIMIZERS] + [["optimizer=external",
                                                               "optimizer._target_=schedulefree.AdamWScheduleFree"]]


@pytest.mark.parametrize("chosen", CONFIGS, ids=lambda chosen: chosen[-1].rpartition("=")[2])
def test_resumed_optimizer_runs_at_the_configured_lr_not_the_checkpoints(chosen):
    checkpoint = trained_checkpoint(composed(*chosen, "optimizer.lr=3e-3"))
    cfg = composed(*chosen, "optimizer.lr=1e-2")
    optimizer, changes = resumed(cfg, checkpoint)
    saved = trained_checkpoint(composed(*chosen, "optimizer.lr=3e-3"), keep_optimizer=True)
    assert group_state(optimizer) == group_state(saved)  # its state kept in its groups: the checkpoint's
    assert changes["optimizer.lr"] == (3e-3, 1e-2)
    lr = apply_schedule(optimizer, 3, SCHEDULE, cfg.optimizer)
    assert lr == learning_rate(3, peak_lr=1e-2, **SCHEDULE)
    # Every group moves with the configured schedule (groups with a lr of their own keep their ratio to it).
    fresh = build_optimizer(cfg.optimizer, build_model(model_config(OmegaConf.to_container(cfg.model))))
    apply_schedule(fresh, 3, SCHEDULE, cfg.optimizer)
    assert hyperparameters(optimizer) == hyperparameters(fresh)


@pytest.mark.parametrize("name, overrides", [
    ("mars-adamw", ["optimizer.gamma=0.1", "optimizer.betas=[0.9,0.9]", "optimizer.weight_decay=0.2",
                    "optimizer.lr_1d=1e-3", "optimizer.weight_decay_1d=0.0"]),
    ("muon", ["optimizer.momentum=0.9", "optimizer.adamw_lr=1e-3", "optimizer.weight_decay=0.1"]),
    ("adamw", ["optimizer.betas=[0.8,0.9]", "optimizer.weight_decay=0.3", "optimizer.eps=1e-6"]),
])
def test_changed_hyperparameters_replace_the_checkpoints_and_the_state_is_kept(name, overrides):
    checkpoint = trained_checkpoint(composed(f"optimizer={name}"))
    cfg = composed(f"optimizer={name}", *overrides)
    optimizer, changes = resumed(cfg, checkpoint)
    assert set(changes) == {override.split("=")[0] for override in overrides}
    fresh = build_optimizer(cfg.optimizer, build_model(model_config(OmegaConf.to_container(cfg.model))))
    assert hyperparameters(optimizer) == hyperparameters(fresh)
    saved_state = checkpoint["optimizer"]["state"]
    loaded_state = optimizer.state_dict()["state"]
    assert saved_state.keys() == loaded_state.keys()
    for index, state in saved_state.items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(loaded_state[index][key])), (index, key)


@pytest.mark.parametrize("override, key", [
    ("model.n_embd=32", "model.n_embd"),
    ("model.n_layer=2", "model.n_layer"),
    ("optimizer=adamw", "optimizer.name"),
    ("model.activation=gelu", "model.activation"),
    ("model.scale_attn_by_inverse_layer_idx=false", "model.scale_attn_by_inverse_layer_idx"),
    ("optimizer.mars_type=mars-lion", "optimizer.mars_type"),
    ("optimizer.is_approx=false", "optimizer.is_approx"),
    ("optimizer.amsgrad=true", "optimizer.amsgrad"),
    ("optimizer.decay_embeddings=true", "optimizer.decay_embeddings"),
])
def test_a_change_that_makes_the_state_meaningless_is_refused_before_loading(override, key):
    checkpoint = trained_checkpoint(composed("optimizer=mars-adamw", "optimizer.decay_embeddings=false"))
    cfg = composed("optimizer=mars-adamw", "optimizer.decay_embeddings=false", override)
    with pytest.raises(ResumeRefused, match=rf"changed {key} \(checkpoint .*, now .*\)"):
        resumed(cfg, checkpoint)


def test_keys_a_checkpoint_does_not_record_are_not_reported_as_changed():
    saved = {"model": {"n_layer": 2}, "train": {"resume": False}}
    configured = {"model": {"n_layer": 2, "activation": "gelu_tanh"}, "train": {"resume": True}}
    assert config_changes(saved, configured) == {}  # activation: unknown before; resume: how this launch starts


@pytest.mark.parametrize("name", REGISTRY)
def test_every_state_defining_key_is_a_config_key_of_its_optimizer(name):
    fields = {f"model.{key}" for key in ModelConfig.__dataclass_fields__}
    fields |= {f"optimizer.{key}" for key in REGISTRY[name].schema.__dataclass_fields__}
    assert set(state_defining_keys(name)) <= fields
    check_resumable({"optimizer.lr": (1e-3, 2e-3)}, "ckpt.pt", name)  # hyperparameters pass


def test_two_rows_with_different_state_keys_resume_independently(monkeypatch):
    # AdamW's eps made state-defining binds AdamW only: MARS, which has an eps too, resumes with another.
    row = dataclasses.replace(REGISTRY["adamw"], state_keys={"eps": "a test's claim that eps defines the state"})
    monkeypatch.setitem(REGISTRY, "adamw", row)
    for name, refused in (("adamw", True), ("mars-adamw", False)):
        checkpoint = trained_checkpoint(composed(f"optimizer={name}"))
        cfg = composed(f"optimizer={name}", "optimizer.eps=1e-6")
        if refused:
            with pytest.raises(ResumeRefused, match=r"changed optimizer.eps \(checkpoint 1e-08, now 1e-06: a test's"):
                resumed(cfg, checkpoint)
        else:
            optimizer, changes = resumed(cfg, checkpoint)
            assert changes == {"optimizer.eps": (1e-8, 1e-6)} and optimizer.param_groups[0]["eps"] == 1e-6


def test_ranks_that_found_different_newest_checkpoints_stop_naming_each_ranks(monkeypatch, tmp_path):
    save_checkpoint(tmp_path, 20, {"step": 20}, keep=2)
    outcomes = [("found", "ckpt_00000020.pt"), ("found", "ckpt_00000010.pt")]  # rank 1 lags (an NFS cache)
    monkeypatch.setattr(resume, "all_gather_objects", lambda outcome, ctx: outcomes)
    with pytest.raises(ValueError, match=r"rank 0: ckpt_00000020.pt, rank 1: ckpt_00000010.pt"):
        resume.find_resume_checkpoint(tmp_path, torch.device("cpu"), DistributedContext())
    outcomes = [("found", "ckpt_00000020.pt")] * 2
    path, state = resume.find_resume_checkpoint(tmp_path, torch.device("cpu"), DistributedContext())
    assert path.name == "ckpt_00000020.pt" and state["step"] == 20


def test_a_rank_that_cannot_read_any_checkpoint_stops_every_rank_not_only_itself(monkeypatch, tmp_path):
    save_checkpoint(tmp_path, 20, {"step": 20}, keep=2)
    outcomes = [("found", "ckpt_00000020.pt"), ("error", "none of the 1 checkpoints in /run can be read")]
    monkeypatch.setattr(resume, "all_gather_objects", lambda outcome, ctx: outcomes)
    with pytest.raises(CheckpointReadError, match=r"rank 1 cannot resume: none of the 1 checkpoints"):
        resume.find_resume_checkpoint(tmp_path, torch.device("cpu"), DistributedContext())


def test_a_rank_that_fails_to_load_tells_the_others_before_it_stops(monkeypatch, tmp_path):
    def out_of_memory(run_dir, device):
        raise torch.OutOfMemoryError("CUDA out of memory")

    told = []
    monkeypatch.setattr(resume, "latest_checkpoint", out_of_memory)
    monkeypatch.setattr(resume, "all_gather_objects", lambda outcome, ctx: told.append(outcome) or [outcome] * 2)
    with pytest.raises(torch.OutOfMemoryError):  # its own error, after the others have heard of it
        resume.find_resume_checkpoint(tmp_path, torch.device("cpu"), DistributedContext())
    assert told == [("error", "CUDA out of memory")]


def test_a_longer_run_is_told_its_decay_stretches_unless_its_schedule_is_constant():
    saved = {"max_iters": 3, "decay_iters": None, "lr_schedule": "constant"}
    constant = OmegaConf.create({"max_iters": 6, "decay_iters": None, "lr_schedule": LrSchedule.constant})
    assert resume.schedule_changes(saved, constant) == []  # no decay to stretch: the lr it steps at is the same
    cosine = OmegaConf.create({"max_iters": 6, "decay_iters": None, "lr_schedule": LrSchedule.cosine})
    assert resume.schedule_changes({**saved, "lr_schedule": "cosine"}, cosine)[0].startswith(
        "the lr schedule now reaches train.min_lr at step 6 instead of the checkpoint's 3")
