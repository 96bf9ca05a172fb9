"""The run config: every schema registered with Hydra (each optimizer's from its row in configs/registry.py), the
config composed outside train.py's Hydra app (configs/config.yaml plus overrides, for scripts, and for train.py to
tell an unknown key in one line before Hydra does in several), and validated."""
import dataclasses
import itertools
import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from configs.registry import OPTIMIZERS
from configs.schema import (COMPILE_MODES, Config, DataConfig, Draws, EvalSampling, LrSchedule, ModelConfig,
                            Sampling, TrainConfig, WandbConfig, check_finite, check_model,
                            check_optimizer_hyperparameters, lr_decay_end, require, unknown_key_message)
from configs.user_dirs import user_config_dirs

CONFIG_DIR = Path(__file__).resolve().parent
# Hydra's words for a config file whose merge failed: "In 'optimizer/mine': ConfigKeyError raised while ...".
_FAILED_FILE = re.compile(r"^In '([^']+)': ")


class UnknownConfigKey(ValueError):
    """A key that no schema knows, on the command line or in a config file; the message names it, where it is,
    and the nearest known key."""


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


# The sections whose schema is the same whatever the config groups chose (the optimizer's is its row's).
FIXED_SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig, "wandb": WandbConfig}


def check_known_keys(cfg) -> None:
    """Refuse keys that no schema knows, however they were added (``+optimizer.gama=0.1`` merges silently)."""
    name, rows = cfg.optimizer.get("name"), OPTIMIZERS
    require(name in rows, f"unknown optimizer.name {name!r}: the optimizers are "
            f"{', '.join(rows)} (optimizer=<one of configs/optimizer/>)")
    sections = {**FIXED_SECTIONS, "optimizer": rows[name].schema}
    for key in cfg:
        require(key in sections, f"unknown config key {key!r}: the top-level keys are {', '.join(sections)}")
    for section, schema in sections.items():
        if schema is None or section not in cfg:
            continue
        known = [f.name for f in dataclasses.fields(schema)]
        for key in cfg[section]:
            require(key in known, unknown_key_message(section, key, known))


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


def refuse_unknown_config_keys(argv: list[str]) -> None:
    """Raise :class:`UnknownConfigKey` for a key that train.py's arguments ``argv`` set (``optimizer.gammma=0.1``)
    or that a config file of the user's own directories sets, and no schema knows.

    Hydra would stop on it with several lines, for an override with the advice to append it (``+optimizer.gammma``,
    which the schema check then refuses). The config is composed as Hydra will compose it, once per option of a
    config group that a sweep runs through (a key may be unknown to one optimizer only); any other failure is left
    to Hydra to tell. Nothing is composed where nothing can be unknown: no directory of the user's, and each dotted
    key set is a field of a section whose schema no choice changes (``train.max_iters``; not ``optimizer.*``).
    """
    arguments = get_args_parser().parse_args(argv)
    if arguments.config_name not in (None, "config") or arguments.config_path:  # another primary config
        return
    try:
        overrides = OverridesParser.create().parse_overrides(arguments.overrides)
    except OverrideParseException:  # a malformed override: Hydra names it
        return
    user_dirs = user_config_dirs(argv)
    if not user_dirs and all(_known_whatever_is_chosen(o.key_or_group) for o in overrides
                             if not (o.is_add() or o.is_delete() or o.is_force_add())):
        return
    if arguments.config_dir:  # as Hydra adds it: on the search path
        overrides = [o for o in overrides if o.key_or_group != "hydra.searchpath"]
        searchpath = ",".join(f"file://{Path(directory).resolve()}" for directory in user_dirs)
        fixed = [f"hydra.searchpath=[{searchpath}]"]
    else:
        fixed = []
    for choices in _launches(overrides):
        try:
            compose_config([*fixed, *choices])
        except Exception as err:  # whatever Hydra stops on; only an unknown key is told here, the rest by Hydra
            message = _unknown_key_message(err, user_dirs)
            if message:
                raise UnknownConfigKey(message) from None


def _known_whatever_is_chosen(key: str) -> bool:
    """Whether ``key`` (of an override) is a config group, Hydra's own, or a field of a fixed section's schema."""
    section, dot, field = key.partition(".")
    if not dot or section == "hydra":
        return True
    return section in FIXED_SECTIONS and field in {f.name for f in dataclasses.fields(FIXED_SECTIONS[section])}


def _launches(overrides) -> list[list[str]]:
    """The overrides of one launch per option of each config group a sweep runs through (``optimizer=adamw,muon``),
    every other swept value at its first: what an unknown key depends on."""
    alternatives = []
    for override in overrides:
        if not override.is_sweep_override():
            alternatives.append([override.input_line])
            continue
        values = [f"{override.get_key_element()}={value}" for value in override.sweep_string_iterator()]
        alternatives.append(values if "." not in override.key_or_group else values[:1])
    if not alternatives:
        return [[]]
    return [list(launch) for launch in itertools.product(*alternatives)]


def _unknown_key_message(err: Exception, user_dirs: list[Path]) -> str | None:
    """Our line for Hydra's failure ``err`` if an unknown key caused it (None otherwise): with the file that sets the
    key where a file does, or as set on the command line."""
    cause = err.__cause__ or err.__context__
    if not isinstance(cause, (ConfigAttributeError, ConfigKeyError)) or not cause.full_key:
        return None
    schema = cause.object_type
    if not dataclasses.is_dataclass(schema):
        return None
    known = [f.name for f in dataclasses.fields(schema)]
    section, _, key = cause.full_key.rpartition(".")
    failed_file = _FAILED_FILE.match(str(err))
    where = f" in {_config_file(failed_file.group(1), user_dirs)}" if failed_file else ""
    if schema is Config:
        return f"unknown config key {cause.full_key!r}{where}: the top-level keys are {', '.join(known)}"
    if not section or "." in section:
        return None
    return unknown_key_message(section, key, known, where)


def _config_file(config_path: str, user_dirs: list[Path]) -> Path | str:
    """The file of Hydra's ``config_path`` (``optimizer/mine``): in the user's directories, else this one's."""
    for directory in [*user_dirs, CONFIG_DIR]:
        candidate = directory / f"{config_path}.yaml"
        if candidate.is_file():
            return candidate
    return f"{config_path}.yaml"
