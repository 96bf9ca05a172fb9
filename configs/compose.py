"""The run config: every schema registered with Hydra (each optimizer's from its row in configs/registry.py), the
config composed outside train.py's Hydra app (configs/config.yaml plus overrides, for scripts), and validated."""
import dataclasses
import difflib
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore

from configs.registry import OPTIMIZERS
from configs.schema import (COMPILE_MODES, Config, ConfigError, DataConfig, Draws, EvalSampling, LrSchedule,
                            ModelConfig, Sampling, TrainConfig, WandbConfig, check_finite, check_model,
                            check_optimizer_hyperparameters, lr_decay_end, require)

CONFIG_DIR = Path(__file__).resolve().parent


def compose_config(overrides: list[str]):
    """The config train.py would run with these command-line overrides (not yet validated)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def register_configs() -> None:
    """The schemas, for Hydra to merge the YAML into. (The default run directory, ``${unique_run_dir:...}``, is
    resolved by train.py: ``training.run_dir.register_run_dir_resolver``.)

    Each optimizer's YAML types itself with ``/optimizer_<name>_schema``, which also sets the ``train.*`` defaults of
    its registry row: after the schema's own, before an experiment's and the command line's, which override them.
    """
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    # Outside the optimizer group, so that Hydra's choices and --help offer only optimizers that train.
    for name, entry in OPTIMIZERS.items():
        store.store(name=f"optimizer_{name}_fields", node=entry.schema)
        store.store(name=f"optimizer_{name}_train_defaults", node={"train": dict(entry.train_defaults)})
        store.store(name=f"optimizer_{name}_schema", node={"defaults": [
            f"/optimizer_{name}_fields@_here_", f"/optimizer_{name}_train_defaults@_global_", "_self_"]})


def check_known_keys(cfg) -> None:
    """Refuse keys that no schema knows, however they were added (``+optimizer.gama=0.1`` merges silently)."""
    name, rows = cfg.optimizer.get("name"), OPTIMIZERS
    require(name in rows, f"unknown optimizer.name {name!r}: the optimizers are "
            f"{', '.join(rows)} (optimizer=<one of configs/optimizer/>)")
    sections = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "wandb": WandbConfig,
                "optimizer": rows[name].schema}
    for key in cfg:
        require(key in sections, f"unknown config key {key!r}: the top-level keys are {', '.join(sections)}")
    for section, schema in sections.items():
        if schema is None or section not in cfg:
            continue
        known = [f.name for f in dataclasses.fields(schema)]
        for key in cfg[section]:
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {section}.{close[0]}? " if close else ""
                raise ConfigError(f"unknown config key {section}.{key}: {hint}the keys of {section} are "
                                  f"{', '.join(known)}")


def validate(cfg) -> None:
    """Range and cross-field checks that the types alone cannot express."""
    check_known_keys(cfg)
    check_finite(cfg)
    m, t, o = cfg.model, cfg.train, cfg.optimizer
    check_model(m)
    for key in ("batch_size", "block_size", "grad_accum_steps", "max_iters", "eval_interval", "eval_iters",
                "log_interval", "checkpoint_interval", "keep_checkpoints"):
        require(t[key] > 0, f"train.{key} must be a positive integer, got {t[key]}")
    require(
       t.block_size <= m.block_size,
       f"train.block_size ({t.block_size}) exceeds the model's context model.block_size ({m.block_size}): "
       "lower train.block_size or raise model.block_size",
   )
    require(t.global_batch_size is None or (t.global_batch_size > 0 and t.global_batch_size % t.batch_size == 0),
            f"train.global_batch_size ({t.global_batch_size}) must be a positive multiple of train.batch_size "
            f"({t.batch_size})")
    require(t.warmup_iters >= 0, f"train.warmup_iters must be >= 0, got {t.warmup_iters}")
    decay_iters = lr_decay_end(t)
    # A run shorter than its warmup (a smoke test) never reaches the decay; otherwise the decay must end after it.
    require(decay_iters > t.warmup_iters or t.warmup_iters >= t.max_iters or t.lr_schedule == LrSchedule.constant,
            f"the lr decay must end after warmup: train.decay_iters ({decay_iters}) <= train.warmup_iters "
            f"({t.warmup_iters}); lower train.warmup_iters or raise train.decay_iters")
    require(0.0 < t.decay_fraction <= 1.0, f"train.decay_fraction must be in (0, 1], got {t.decay_fraction}")
    require(t.hellaswag_interval >= 0, f"train.hellaswag_interval must be >= 0 (0: none), got {t.hellaswag_interval}")
    require(t.hellaswag_items is None or t.hellaswag_items > 0,
            f"train.hellaswag_items must be positive or null (all), got {t.hellaswag_items}")
    require(t.loss_chunk_size >= 0, f"train.loss_chunk_size must be >= 0 tokens (0: the plain loss), got "
            f"{t.loss_chunk_size}")
    require(t.compile_mode in COMPILE_MODES,
            f"train.compile_mode must be one of {', '.join(COMPILE_MODES)}, got {t.compile_mode!r}")
    require(t.compile or t.compile_mode == "default",
            f"train.compile_mode={t.compile_mode} is torch.compile's mode: set train.compile=true with it")
    require(t.distributed_timeout_s > 0,
            f"train.distributed_timeout_s must be > 0 seconds, got {t.distributed_timeout_s}")
    require(t.max_skipped_steps >= 0, f"train.max_skipped_steps must be >= 0, got {t.max_skipped_steps}")
    require(t.diverged_val_loss_ratio >= 1.0, f"train.diverged_val_loss_ratio must be >= 1 (1: a val loss above "
            f"the untrained model's), got {t.diverged_val_loss_ratio}")
    require(t.grad_clip >= 0.0, f"train.grad_clip must be >= 0 (0 disables it), got {t.grad_clip}")
    require(t.grad_multiplier > 0.0, f"train.grad_multiplier must be positive (1: the mean gradient), got "
            f"{t.grad_multiplier}")
    require(o.lr > 0.0, f"optimizer.lr must be positive, got {o.lr}")
    require(0.0 <= t.min_lr <= o.lr, f"train.min_lr ({t.min_lr}) must lie in [0, optimizer.lr={o.lr}]")
    for key in OPTIMIZERS[o.name].schema.part_lrs:
        require(t.min_lr <= o[key], f"train.min_lr ({t.min_lr}) must not exceed optimizer.{key} ({o[key]}): "
                f"every part of {o.name} decays to train.min_lr")
    check_optimizer_hyperparameters(o)
    OPTIMIZERS[o.name].check(o)
    require(t.eval_sampling == EvalSampling.fixed or cfg.data.sampling != Sampling.sequential,
            "train.eval_sampling=fresh draws random validation windows, which data.sampling=sequential does not "
            "serve: use train.eval_sampling=fixed, or data.sampling=random")
    require(cfg.data.draws == Draws.keyed or t.eval_sampling == EvalSampling.fresh,
            "data.draws=authors draws new validation windows at every evaluation, as their trainer: set "
            "train.eval_sampling=fresh with it")
    require(cfg.data.name != "custom" or cfg.data.dir is not None,
            "data=custom needs data.dir=/path/to/shards (made by `python -m data.prepare files ... --out DIR`)")
