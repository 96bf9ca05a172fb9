"""Learning-rate schedules: warmup, then cosine, linear, constant or warmup-stable-decay down to min_lr."""
import logging
import math

from configs.registry import optimizer_entry
from configs.schema import LrSchedule
from mars.optimizer import ratio_key

log = logging.getLogger(__name__)


def learning_rate(step: int, *, peak_lr: float, min_lr: float, warmup_iters: int, decay_iters: int,
                  schedule: LrSchedule, decay_fraction: float = 0.2) -> float:
    """The learning rate at ``step`` (0-based); warmup rises linearly from 0 as in the MARS authors' trainer."""
    if step < warmup_iters:
        return peak_lr * step / warmup_iters
    if schedule == LrSchedule.constant:
        return peak_lr
    if step >= decay_iters:
        return min_lr
    if schedule == LrSchedule.wsd:
        cooldown_start = wsd_cooldown_start(warmup_iters, decay_iters, decay_fraction)
        if step < cooldown_start:
            return peak_lr
        progress = (step - cooldown_start) / (decay_iters - cooldown_start)
        return peak_lr + progress * (min_lr - peak_lr)
    progress = (step - warmup_iters) / (decay_iters - warmup_iters)
    if schedule == LrSchedule.linear:
        return peak_lr + progress * (min_lr - peak_lr)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak_lr - min_lr)


def wsd_cooldown_start(warmup_iters: int, decay_iters: int, decay_fraction: float) -> int:
    """The step at which the wsd schedule leaves its peak: the last ``decay_fraction`` of the steps after warmup."""
    return decay_iters - max(1, round(decay_fraction * (decay_iters - warmup_iters)))


def schedule_shortfalls(t, peak_lr: float) -> list[str]:
    """What the lr schedule of the train config ``t`` never gets to do before the run ends at ``t.max_iters``:
    reach its peak (warmup as long as the run), leave it (wsd's cooldown after the end) or decay to min_lr
    (``decay_iters`` after the end). Each message says how to fix it."""
    decay_iters = t.decay_iters or t.max_iters
    last_lr = learning_rate(t.max_iters - 1, peak_lr=peak_lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters,
                            decay_iters=decay_iters, schedule=t.lr_schedule, decay_fraction=t.decay_fraction)
    ends = f"the run ends at train.max_iters={t.max_iters}, its last step at lr {last_lr:.3g}"
    if t.warmup_iters >= t.max_iters:
        return [f"train.warmup_iters={t.warmup_iters} is not below train.max_iters={t.max_iters}: the lr rises for "
                f"the whole run and never reaches its peak optimizer.lr={peak_lr:g} ({ends}). Lower "
                "train.warmup_iters (a tenth of train.max_iters is usual) or raise train.max_iters"]
    if t.lr_schedule == LrSchedule.constant or decay_iters <= t.max_iters:
        return []
    if t.lr_schedule == LrSchedule.wsd and wsd_cooldown_start(t.warmup_iters, decay_iters,
                                                              t.decay_fraction) >= t.max_iters:
        return [f"train.lr_schedule=wsd cools down only from step "
                f"{wsd_cooldown_start(t.warmup_iters, decay_iters, t.decay_fraction)} on (train.decay_iters="
                f"{decay_iters}), but {ends}: the lr never leaves its peak. Set train.decay_iters=null (the "
                "cooldown ends with the run) or raise train.max_iters"]
    return [f"the lr decays to train.min_lr={t.min_lr:g} at train.decay_iters={decay_iters}, but {ends}. Right for "
            "the first part of a longer run; otherwise set train.decay_iters=null (the decay ends with the run)"]


def warn_about_schedule_shortfalls(t, peak_lr: float) -> None:
    for message in schedule_shortfalls(t, peak_lr):
        log.warning(message)


def set_learning_rate(optimizer, lr: float, peak_lr: float) -> None:
    """Scale every param group by lr / peak_lr, keeping groups that start with their own lr in proportion."""
    for group in optimizer.param_groups:
        group.setdefault("peak_lr", group["lr"])
        group["lr"] = group["peak_lr"] * lr / peak_lr


def set_part_lr(optimizer, key: str, ratio: float) -> None:
    """Set the learning rate ``key`` of a part of ``optimizer`` (MARS's ``lr_1d``, Muon's ``adamw_lr``) to ``ratio``
    times each param group's lr: the group's ratio (``mars.optimizer.ratio_key``), which the optimizer multiplies
    by the group's lr at its step, so that a group that starts with its own lr keeps its parts in proportion.
    Set in every group, ZeroRedundancyOptimizer's too (its step copies it into its shard's groups)."""
    for group in optimizer.param_groups:
        group[ratio_key(key)] = ratio


def apply_schedule(optimizer, step: int, schedule: dict, optimizer_cfg) -> float:
    """Set every learning rate of ``optimizer`` for ``step``; returns the configured optimizer's (``lr``) one.

    ``schedule``: the keyword arguments of :func:`learning_rate` but ``peak_lr``, which is ``optimizer_cfg.lr``.
    The parts the optimizer's schema names follow it: in ``proportional_lrs`` at their configured ratio to lr (MARS's
    ``lr_1d``, as the authors' ``lr_1d_factor``), in ``part_lrs`` each on the same schedule from its own peak (Muon's
    AdamW part, as the authors schedule Muon's and AdamW's learning rates, to the same min_lr). At lr = 0 (the first
    warmup step) both parts are 0.
    """
    lr = learning_rate(step, peak_lr=optimizer_cfg.lr, **schedule)
    set_learning_rate(optimizer, lr, optimizer_cfg.lr)
    schema = optimizer_entry(optimizer_cfg.name).schema
    for key in schema.proportional_lrs:
        set_part_lr(optimizer, key, optimizer_cfg[key] / optimizer_cfg.lr)
    for key in schema.part_lrs:
        part_lr = learning_rate(step, peak_lr=optimizer_cfg[key], **schedule)
        set_part_lr(optimizer, key, part_lr / lr if lr > 0.0 else 0.0)
    return lr
