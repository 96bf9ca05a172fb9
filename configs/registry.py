"""Every optimizer the harness runs, named once: its config schema and check, its train.* defaults, how it is built,
how the model's parameters are grouped for it, what a resume may not change, and how the tables and figures name
it.

Adding an optimizer: its update rule in ``mars/``, one ``OptimizerEntry`` in ``OPTIMIZERS`` below (its config
dataclass, a subclass of ``OptimizerConfig`` defined here or in ``configs/schema.py``, and the function that builds
it), one YAML in ``configs/optimizer/``, and its test (docs/optimizers.md). The tests, benches and docs read the
optimizers from here, the YAML files and ``mars/``'s modules.

The rows import the schema (``configs/schema.py``), never the other way: ``configs/compose.py`` registers each row's
schema with Hydra and validates a config with its row's check.
"""
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from configs.schema import (AdamWConfig, ConfigError, LrSchedule, MarsConfig, MarsMConfig, MoonlightConfig, MuonConfig,
                            OptimizerConfig, require)
from mars.traits import constructor_arguments

log = logging.getLogger("train")


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool) -> list[dict]:
    """nanoGPT's grouping: weight decay on >=2-D weights; none on biases, norms and other 1-D tensors.

    With ``decay_embeddings=False`` the embedding tables join the no-decay group, as in the MARS authors'
    trainer. (MARS applies its own ``weight_decay_1d`` to 1-D tensors whatever their group says.)
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():  # yields tied weights once
        if not param.requires_grad:
            continue
        decayed = param.dim() >= 2 and (decay_embeddings or id(param) not in embeddings)
        (decay if decayed else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# Parameter names the MARS-M authors keep out of the matrix rule (MARS_M/train_mars_m.py:212-219): embeddings and
# the head, which is tied to the token embedding here.
EMBEDDING_NAMES = ("wte", "wpe", "lm_head", "embed_tokens")


def matrix_rule_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """MARS-M's and Moonlight's grouping: 2-D weights other than embeddings take the matrix rule, the rest
    AdamW; every tensor decays at ``weight_decay``, as the authors' optimizers apply one ``wd`` to both."""
    matrices, others = [], []
    for name, param in model.named_parameters():  # yields tied weights once
        if not param.requires_grad:
            continue
        matrix = param.dim() == 2 and not any(part in name for part in EMBEDDING_NAMES)
        (matrices if matrix else others).append(param)
    return [{"params": matrices, "matrix_rule": True, "weight_decay": weight_decay},
            {"params": others, "matrix_rule": False, "weight_decay": weight_decay}]


NEWTON_SCHULZ_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def newton_schulz_dtype(name: str, key: str = "ns_dtype", device: torch.device | None = None,
                        runs: bool = True) -> torch.dtype:
    """The dtype that ``optimizer.<key>`` names: Newton-Schulz's, or that of Muon's updates (same choices).

    ``auto`` (Newton-Schulz only) is the authors' bfloat16 on CUDA and float32 elsewhere: CPUs without bfloat16
    matrix units run bfloat16 products ~10x slower than float32 ones (results/bench_newton_schulz_cpu.md). The
    choice is logged when the optimizer ``runs`` Newton-Schulz (MARS-AdamW and MARS-Lion never do).
    """
    if name == "auto" and device is not None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if runs:
            log.info("Newton-Schulz in %s on %s (optimizer.%s=auto)", str(dtype).removeprefix("torch."),
                     device.type, key)
        return dtype
    if name not in NEWTON_SCHULZ_DTYPES:
        choices = sorted(NEWTON_SCHULZ_DTYPES) + (["auto"] if device is not None else [])
        raise ValueError(f"optimizer.{key} must be one of {choices}, got {name!r}")
    return NEWTON_SCHULZ_DTYPES[name]


Arguments = tuple[type[torch.optim.Optimizer], dict]


@dataclass(frozen=True)
class OptimizerEntry:
    """What the harness knows of one optimizer; ``cfg`` below is its ``optimizer`` config section (a DictConfig,
    or a saved run's dict)."""

    schema: type  # its config dataclass (configs/schema.py or beside its row); ``schema.name`` is its name
    # The optimizer class and its constructor arguments but the parameters, for parameters on a device.
    arguments: Callable[[Mapping, torch.device], Arguments]
    # A run's label in tables and figures (one per variant it runs) -> the name tables, figures and
    # scripts/bench_train.py show, in table order.
    labels: dict[str, str]
    # Its check of the whole config it trains under (``run.optimizer``, ``run.train``: schedule, warmup, precision),
    # beyond what configs.schema checks of every optimizer (betas, eps, momentum, gamma, weight decays, learning
    # rates by their names): one ``require(condition, message)`` a setting, raising ConfigError naming the key and
    # the fix before any data loads. The train settings it refuses are said here.
    check: Callable[[Mapping], None] = lambda run: None
    # The train.* settings it runs with by default (train.py's own otherwise): those it needs. An experiment or the
    # command line overrides them (its check refuses what it cannot run with).
    train_defaults: Mapping[str, Any] = field(default_factory=dict)
    # The label of a run of this config; by default its name.
    label: Callable[[Mapping], str] = lambda cfg: cfg["name"]
    # The model's parameters as its param groups; by default nanoGPT's grouping.
    groups: Callable[[nn.Module, Mapping], list[dict]] = (
        lambda model, cfg: param_groups(model, cfg["weight_decay"], cfg["decay_embeddings"]))
    # Whether it orthogonalises updates with Newton-Schulz (then DDP ranks share that work out).
    orthogonalises: Callable[[Mapping], bool] = lambda cfg: False
    # Its config keys whose change on resume leaves the checkpoint's state without meaning, and why: refused for
    # this optimizer only (another row's key of the same name is its own).
    state_keys: dict[str, str] = field(default_factory=dict)
    # The lr a run logs, from the optimizer after its step and the trainer's scheduled lr: by default the lr the
    # optimizer says it stepped at (``scheduled_lr`` in its first group, as schedule-free's warmup keeps it), else
    # the trainer's.
    reported_lr: Callable[[torch.optim.Optimizer, float], float] = (
        lambda optimizer, lr: optimizer.param_groups[0].get("scheduled_lr", lr))
    # Its config keys that a config of this kind never reads (a run differing only there ran the same thing).
    unread_keys: Callable[[Mapping], tuple[str, ...]] = lambda cfg: ()
    # The labels the MARS paper's table has rows for (scripts/make_table.py compares them with the paper).
    paper_rows: tuple[str, ...] = ()
    # Whether the authors' trainer for it draws a whole step's training batches ahead (their MARS and MARS-M
    # trainers, MARS/train_mars.py:275-280) rather than one (AdamW, Muon, Moonlight: MARS/train_adamw.py:263):
    # what data.draws=authors follows (data/authors_draws.py).
    authors_draw_a_step_ahead: bool = False

    @property
    def name(self) -> str:
        return self.schema.name

    def authors_batches_ahead(self, grad_accum_steps: int) -> int:
        """The training batches the authors' trainer for it draws before its first step."""
        return grad_accum_steps if self.authors_draw_a_step_ahead else 1


def adamw_arguments(cfg, device: torch.device) -> Arguments:
    # The fused kernel is the fastest AdamW on CUDA and on the CPU alike (results/bench_optimizer_cpu.md).
    return torch.optim.AdamW, dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=True)


def mars_runs_newton_schulz(cfg) -> bool:
    return cfg["mars_type"] == "mars-shampoo"


def mars_arguments(cfg, device: torch.device) -> Arguments:
    from mars import MARS
    from mars.optimizer import triton_interpreter_enabled

    if cfg.backend == "triton" and device.type != "cuda" and not triton_interpreter_enabled():
        raise ValueError(f"optimizer.backend=triton needs a CUDA device, and the run is on {device}: use "
                         "optimizer.backend=auto (Triton on CUDA, PyTorch elsewhere) or torch")
    return MARS, dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                      amsgrad=cfg.amsgrad, gamma=cfg.gamma, is_approx=cfg.is_approx, mars_type=cfg.mars_type,
                      optimize_1d=cfg.optimize_1d, lr_1d=cfg.lr_1d, betas_1d=tuple(cfg.betas_1d),
                      weight_decay_1d=cfg.weight_decay_1d, backend=cfg.backend,
                      ns_dtype=newton_schulz_dtype(cfg.ns_dtype, device=device, runs=mars_runs_newton_schulz(cfg)),
                      ns_form=cfg.ns_form, ns_cuda_graph=cfg.ns_cuda_graph, ns_batch=cfg.ns_batch)


def check_mars_config(run) -> None:
    from mars.reference import MARS_TYPES

    mars_type = run.optimizer.mars_type
    require(mars_type in MARS_TYPES, f"optimizer.mars_type must be one of {', '.join(MARS_TYPES)}, got {mars_type!r}")


def mars_label(cfg) -> str:
    """mars-approx, mars-exact, mars-lion-approx, mars-shampoo-exact, ..."""
    variant = "mars" if cfg["mars_type"] == "mars-adamw" else cfg["mars_type"]
    return f"{variant}-{'approx' if cfg['is_approx'] else 'exact'}"


def muon_arguments(cfg, device: torch.device) -> Arguments:
    from mars import Muon

    return Muon, dict(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, ns_steps=cfg.ns_steps,
                      weight_decay=cfg.weight_decay, adamw_lr=cfg.adamw_lr, adamw_betas=tuple(cfg.adamw_betas),
                      adamw_eps=cfg.adamw_eps, adamw_weight_decay=cfg.adamw_weight_decay,
                      ns_dtype=newton_schulz_dtype(cfg.ns_dtype, device=device), adamw_variant=cfg.adamw_variant,
                      update_dtype=newton_schulz_dtype(cfg.update_dtype, key="update_dtype"),
                      ns_form=cfg.ns_form, ns_cuda_graph=cfg.ns_cuda_graph, ns_batch=cfg.ns_batch)


def matrix_rule_arguments(cfg, device: torch.device) -> dict:
    """The arguments MARS-M and Moonlight share."""
    return dict(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, ns_steps=cfg.ns_steps,
                adamw_betas=tuple(cfg.adamw_betas), adamw_eps=cfg.adamw_eps,
                ns_dtype=newton_schulz_dtype(cfg.ns_dtype, device=device), ns_form=cfg.ns_form,
                ns_cuda_graph=cfg.ns_cuda_graph, ns_batch=cfg.ns_batch)


def mars_m_arguments(cfg, device: torch.device) -> Arguments:
    from mars import MarsM, MarsMEfficient

    arguments = matrix_rule_arguments(cfg, device)
    if cfg.memory_efficient:
        if not cfg.is_approx:
            raise ValueError("optimizer.memory_efficient=true has the approximate scheme only: set "
                             "optimizer.is_approx=true, or memory_efficient=false for the exact scheme")
        return MarsMEfficient, dict(arguments, gamma=cfg.gamma)
    return MarsM, dict(arguments, gamma=cfg.gamma, clip_c=cfg.clip_c, is_approx=cfg.is_approx)


def mars_m_label(cfg) -> str:
    if cfg.get("memory_efficient"):
        return "mars-m-efficient"
    return f"mars-m-{'approx' if cfg['is_approx'] else 'exact'}"


def moonlight_arguments(cfg, device: torch.device) -> Arguments:
    from mars import Moonlight

    return Moonlight, dict(matrix_rule_arguments(cfg, device), nesterov=cfg.nesterov)


@dataclass
class ScheduleFreeSGDConfig(OptimizerConfig):
    """Schedule-free SGD (mars.ScheduleFreeSGD): no lr decay; evaluated at the average of its iterates."""

    name: str = "schedule-free-sgd"
    momentum: float = 0.9


def schedule_free_sgd_arguments(cfg, device: torch.device) -> Arguments:
    from mars import ScheduleFreeSGD

    return ScheduleFreeSGD, dict(lr=cfg.lr, momentum=cfg.momentum)


def check_schedule_free(run) -> None:
    schedule = LrSchedule(run.train.lr_schedule)
    require(schedule == LrSchedule.constant, f"train.lr_schedule={schedule.value} decays the lr, which "
            "schedule-free SGD replaces by its average: set train.lr_schedule=constant (a warmup stays)")


@dataclass
class ExternalConfig(OptimizerConfig):
    """Any installed ``torch.optim.Optimizer``, named by its import path as Hydra's ``_target_`` names a class
    (``optimizer=external optimizer._target_=schedulefree.AdamWScheduleFree optimizer.lr=1e-3``); its other
    constructor arguments as ``+optimizer.<argument>=<value>``. Weight decay on >=2-D weights only, as our rows."""

    name: str = "external"
    takes_class_arguments: ClassVar[bool] = True
    _target_: str = "torch.optim.NAdam"


# The keys of optimizer=external that are not its class's constructor arguments (weight_decay goes to the groups).
EXTERNAL_OWN_KEYS = ("name", "_target_", "decay_embeddings")


def external_class(cfg) -> type[torch.optim.Optimizer]:
    """The class ``optimizer._target_`` names, refused in one line unless it is an installed torch optimizer."""
    target = cfg["_target_"]
    module, _, name = target.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None) if module else None
    except ImportError as error:
        raise ConfigError(f"optimizer._target_={target} cannot be imported ({error}): install its package, or "
                          "name an installed optimizer class (torch.optim.NAdam)") from None
    require(isinstance(found, type) and issubclass(found, torch.optim.Optimizer),
            f"optimizer._target_={target} is not a torch.optim.Optimizer class: name one by its import path "
            "(schedulefree.AdamWScheduleFree, torch.optim.NAdam)")
    return found


def external_arguments(cfg, device: torch.device) -> Arguments:
    arguments = {key: tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else value
                 for key, value in cfg.items() if key not in (*EXTERNAL_OWN_KEYS, "weight_decay")}
    return external_class(cfg), arguments


def check_external(run) -> None:
    """Every key of optimizer=external is an argument of its class (weight decay, unless 0, too)."""
    cfg = run.optimizer
    optimizer_class = external_class(cfg)
    known = constructor_arguments(optimizer_class)
    require("weight_decay" in known or cfg.weight_decay == 0.0, f"optimizer.weight_decay={cfg.weight_decay}: "
            f"{cfg._target_} takes no weight decay, set optimizer.weight_decay=0")
    for key in cfg:
        require(key in known or key in (*EXTERNAL_OWN_KEYS, "weight_decay"),
                f"optimizer.{key} is not an argument of {cfg._target_}: its arguments are {', '.join(sorted(known))}")


def external_label(cfg) -> str:
    """An external optimizer's class name (AdamWScheduleFree), as the tables show it."""
    return cfg["_target_"].rpartition(".")[2]


IS_APPROX = {"is_approx": "the MARS scheme (exact or approximate) and its remembered gradients"}

# In the tables' order: the paper's baselines, MARS, then the second paper's (MARS-M) optimizers.
OPTIMIZERS: dict[str, OptimizerEntry] = {entry.name: entry for entry in (
    OptimizerEntry(AdamWConfig, adamw_arguments, labels={"adamw": "AdamW"}, paper_rows=("adamw",)),
    OptimizerEntry(MuonConfig, muon_arguments, labels={"muon": "Muon"}, orthogonalises=lambda cfg: True,
                   paper_rows=("muon",)),
    OptimizerEntry(
        MarsConfig, mars_arguments, label=mars_label, check=check_mars_config, orthogonalises=mars_runs_newton_schulz,
        labels={"mars-exact": "MARS-exact", "mars-approx": "MARS-approx", "mars-lion-approx": "MARS-Lion",
                "mars-lion-exact": "MARS-Lion-exact", "mars-shampoo-approx": "MARS-Shampoo",
                "mars-shampoo-exact": "MARS-Shampoo-exact"},
        state_keys={"mars_type": "the MARS variant and its state", **IS_APPROX,
                    "amsgrad": "the optimizer's state (the running maximum of the second moment)",
                    "optimize_1d": "which rule, and which state, the 1-D tensors have"},
        unread_keys=lambda cfg: () if mars_runs_newton_schulz(cfg) else ("ns_dtype", "ns_form", "ns_batch"),
        paper_rows=("mars-exact", "mars-approx"), authors_draw_a_step_ahead=True),
    OptimizerEntry(MoonlightConfig, moonlight_arguments, labels={"moonlight": "Moonlight"},
                   groups=lambda model, cfg: matrix_rule_groups(model, cfg["weight_decay"]),
                   orthogonalises=lambda cfg: True),
    OptimizerEntry(MarsMConfig, mars_m_arguments, label=mars_m_label,
                   labels={"mars-m-approx": "MARS-M", "mars-m-exact": "MARS-M-exact",
                           "mars-m-efficient": "MARS-M-efficient"},
                   groups=lambda model, cfg: matrix_rule_groups(model, cfg["weight_decay"]),
                   orthogonalises=lambda cfg: True,
                   state_keys={**IS_APPROX, "memory_efficient": "the MARS-M variant and its state"},
                   authors_draw_a_step_ahead=True),
    OptimizerEntry(ScheduleFreeSGDConfig, schedule_free_sgd_arguments, labels={"schedule-free-sgd": "SF-SGD"},
                   check=check_schedule_free, train_defaults={"lr_schedule": "constant"}),
    OptimizerEntry(ExternalConfig, external_arguments, label=external_label, check=check_external, labels={},
                   state_keys={"_target_": "the optimizer class and its state"}),
)}


def optimizer_entry(name: str) -> OptimizerEntry:
    """The entry of the optimizer named ``name`` (``optimizer.name``)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: the optimizers are {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name]
