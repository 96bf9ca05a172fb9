"""The run config: every schema registered with Hydra (each optimizer's from its row in configs/registry.py), the
config composed outside train.py's Hydra app (configs/config.yaml plus overrides, for scripts, and for train.py to
tell in one line what Hydra would refuse in several), and validated."""
import dataclasses
import itertools
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra._internal.utils import get_args_parser
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from configs.composition_errors import composition_failure_message, several_values_message, unquoted_tilde_message
from configs.registry import OPTIMIZERS
from configs.resolvers import register_config_resolvers
from configs.schema import (COMPILE_MODES, Config, DataConfig, Draws, EvalSampling, LrSchedule, ModelConfig,
                            Sampling, TrainConfig, WandbConfig, check_finite, check_model,
                            check_optimizer_hyperparameters, lr_decay_end, require, unknown_key_message)
from configs.user_dirs import user_config_dirs

CONFIG_DIR = Path(__file__).resolve().parent
# The sweeps whose values an override lists itself (a,b and choice(a,b); range(1,3)).
ENUMERABLE_SWEEPS = (ValueType.SIMPLE_CHOICE_SWEEP, ValueType.CHOICE_SWEEP, ValueType.RANGE_SWEEP)


class ConfigRefused(ValueError):
    """What Hydra would refuse to compose, on the command line or in a config file (an unknown key or option, a
    value of the wrong type, an unquoted ``~``, a sweep without ``-m``); the message is one line naming it, where
    it is and the fix."""


def compose_config(overrides: list[str]):
    """The config train.py would run with these command-line overrides (not yet validated)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def register_configs() -> None:
    """The schemas, for Hydra to merge the YAML into, and our resolvers (configs/resolvers.py). (The default run
    directory, ``${unique_run_dir:...}``, is resolved by train.py: ``training.run_dir.register_run_dir_resolver``.)

    Each optimizer's YAML types itself with ``/optimizer_<name>_schema``, which also sets the ``train.*`` defaults of
    its registry row: after the schema's own, before an experiment's and the command line's, which override them.
    """
    register_config_resolvers()
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
        if schema is None or section not in cfg or getattr(schema, "takes_class_arguments", False):
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
    require(not (t.hellaswag_interval and cfg.data.name == "c4"),
            "train.hellaswag_interval: HellaSwag is scored in GPT-2's tokens, and data=c4's are t5-base's: set "
            "train.hellaswag_interval=0 (C4 runs compare by val/perplexity)")
    require(t.loss_chunk_size >= 0, f"train.loss_chunk_size must be >= 0 tokens (0: the plain loss), got "
            f"{t.loss_chunk_size}")
    require(t.compile_mode in COMPILE_MODES,
            f"train.compile_mode must be one of {', '.join(COMPILE_MODES)}, got {t.compile_mode!r}")
    require(t.compile or t.compile_mode == "default",
            f"train.compile_mode={t.compile_mode} is torch.compile's mode: set train.compile=true with it")
    require(t.distributed_timeout_s > 0,
            f"train.distributed_timeout_s must be > 0 seconds, got {t.distributed_timeout_s}")
    require(cfg.wandb.init_timeout_s > 0, f"wandb.init_timeout_s must be > 0 seconds, got {cfg.wandb.init_timeout_s}")
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
    OPTIMIZERS[o.name].check(cfg)
    require(t.eval_sampling != EvalSampling.fresh or cfg.data.sampling != Sampling.sequential,
            "train.eval_sampling=fresh draws random validation windows, which data.sampling=sequential does not "
            "serve: use train.eval_sampling=fixed, or data.sampling=random")
    require(cfg.data.draws == Draws.keyed or t.eval_sampling == EvalSampling.fresh,
            "data.draws=authors draws new validation windows at every evaluation, as their trainer: set "
            "train.eval_sampling=fresh with it")
    require(cfg.data.name != "custom" or cfg.data.dir is not None,
            "data=custom needs data.dir=/path/to/shards (made by `python -m data.prepare files ... --out DIR`)")


def refuse_config_errors(argv: list[str]) -> None:
    """Raise :class:`ConfigRefused` for what Hydra would refuse in train.py's arguments ``argv`` or in a config file
    of the user's own directories: an unknown key (``optimizer.gammma=0.1``, told with the nearest known key where
    Hydra advises appending it: ``+optimizer.gammma``, which the schema check then refuses), an unknown option of a
    config group (``optimizer=mars-adam``), a value of the wrong type (``optimizer.lr=fast``, ``train.max_iters=1e3``),
    an unquoted ``~`` (``data.dir=~/data/mine``), several values without ``-m`` (``optimizer.lr=1e-3,3e-3``).

    The config is composed as Hydra will compose it, once per option of a config group that a sweep runs through
    and once per other swept value (a key may be unknown to one optimizer only, a value be of the wrong type at one
    point only); any other failure is left to Hydra to tell, as are a sweep point's own refusals (``validate``),
    which the sweep records and goes on past. Nothing is composed where nothing can fail: no directory of the
    user's, each group's option a file of configs/, and each dotted key set a field, of a type its value fits, of a
    section whose schema no choice changes (``train.max_iters=5``; not ``optimizer.*``).
    """
    arguments = get_args_parser().parse_args(argv)
    if arguments.config_name not in (None, "config") or arguments.config_path:  # another primary config
        return
    try:
        overrides = OverridesParser.create().parse_overrides(arguments.overrides)
    except OverrideParseException:  # a malformed override: Hydra names it, but for an unquoted ~
        _refuse(unquoted_tilde_message(arguments.overrides))
        return
    multirun = arguments.multirun or any(o.key_or_group == "hydra.mode" and o.value() == "MULTIRUN" for o in overrides)
    several = next((o for o in overrides if o.is_sweep_override()), None)
    if several and not multirun:
        _refuse(several_values_message(several))
    if any(o.is_sweep_override() and o.value_type not in ENUMERABLE_SWEEPS for o in overrides):
        return  # glob(...), interval(...): what they run through is Hydra's (or its sweeper's) to find
    user_dirs = user_config_dirs(argv)
    if not user_dirs and _cannot_fail(overrides):
        return
    if arguments.config_dir:  # as Hydra adds it: on the search path
        overrides = [o for o in overrides if o.key_or_group != "hydra.searchpath"]
        searchpath = ",".join(f"file://{Path(directory).resolve()}" for directory in user_dirs)
        fixed = [f"hydra.searchpath=[{searchpath}]"]
    else:
        fixed = []
    for launch in _launches(overrides):
        try:
            compose_config([*fixed, *launch])
        except Exception as err:  # whatever Hydra stops on; only what composition_errors knows is told here
            _refuse(composition_failure_message(err, launch, [*user_dirs, CONFIG_DIR], user_dirs))


def _refuse(message: str | None) -> None:
    if message:
        raise ConfigRefused(message) from None


def _cannot_fail(overrides) -> bool:
    """Whether composing cannot fail on ``overrides`` whatever the groups choose: each is a deletion or addition of a
    key (the schema check refuses an unknown one by name), Hydra's own key, an option of a config group that is a
    file of configs/, or a value that fits its field of a fixed section's schema."""
    empty = {section: OmegaConf.structured(schema) for section, schema in FIXED_SECTIONS.items()}
    for override in overrides:
        key = override.key_or_group
        values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
        section, dot, field = key.partition(".")
        if override.is_delete() or (dot and (section == "hydra" or override.is_add() or override.is_force_add())):
            continue
        if not dot:
            if not all(value is None or (CONFIG_DIR / key / f"{value}.yaml").is_file() for value in values):
                return False
            continue
        known = section in FIXED_SECTIONS and field in {f.name for f in dataclasses.fields(FIXED_SECTIONS[section])}
        if not known or not all(_fits(empty[section], field, value) for value in values):
            return False
    return True


def _fits(node, field: str, value) -> bool:
    """Whether ``value`` converts to the type of ``node``'s ``field``, as Hydra will convert it."""
    try:
        node[field] = value
    except ValidationError:
        return False
    return True


def _launches(overrides) -> list[list[str]]:
    """The overrides of one launch per option of each config group a sweep runs through (``optimizer=adamw,muon``),
    every other swept value at its first, and of one more launch per further value of each other swept key
    (``optimizer.lr=1e-3,fast``): what an unknown key and a value's type depend on."""
    alternatives = [[f"{o.get_key_element()}={value}" for value in o.sweep_string_iterator()]
                    if o.is_sweep_override() else [o.input_line] for o in overrides]
    swept_values = [k for k, o in enumerate(overrides) if o.is_sweep_override() and "." in o.key_or_group]
    firsts = [values[:1] if k in swept_values else values for k, values in enumerate(alternatives)]
    launches = [list(launch) for launch in itertools.product(*firsts)]
    for k in swept_values:
        launches += [[*launch[:k], value, *launch[k + 1:]] for launch in itertools.product(*firsts)
                     for value in alternatives[k][1:]]
    return launches
