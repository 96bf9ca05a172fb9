"""Learning-rate schedules: warmup, then cosine, linear, constant or warmup-stable-decay down to min_lr."""
import math

from configs.schema import OPTIMIZER_SCHEMAS, LrSchedule


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
        cooldown_start = decay_iters - max(1, round(decay_fraction * (decay_iters - warmup_iters)))
        if step < cooldown_start:
            return peak_lr
        progress = (step - cooldown_start) / (decay_iters - cooldown_start)
        return peak_lr + progress * (min_lr - peak_lr)
    progress = (step - warmup_iters) / (decay_iters - warmup_iters)
    if schedule == LrSchedule.linear:
        return peak_lr + progress * (min_lr - peak_lr)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak_lr - min_lr)


def set_learning_rate(optimizer, lr: float, peak_lr: float) -> None:
    """Scale every param group by lr / peak_lr, keeping groups that start with their own lr in proportion."""
    for group in optimizer.param_groups:
        group.setdefault("peak_lr", group["lr"])
        group["lr"] = group["peak_lr"] * lr / peak_lr


def set_part_lr(optimizer, key: str, part_lr: float, lr: float) -> None:
    """Give the part of ``optimizer`` whose peak is ``optimizer.<key>`` (Muon's AdamW part: ``adamw_lr``) the
    learning rate ``part_lr`` while the optimizer's own is ``lr``.

    The MARS authors schedule Muon's and AdamW's learning rates separately, each from its own peak to the same
    min_lr; Muon applies its AdamW part at ``group['lr'] * group['adamw_lr_ratio']``, so the ratio follows the
    two schedules. At lr = 0 (the first warmup step) the ratio is kept: both parts stand still anyway.
    """
    if lr <= 0.0:
        return
    for group in optimizer.param_groups:
        if f"{key}_ratio" in group:
            group[f"{key}_ratio"] = part_lr / lr


def apply_schedule(optimizer, step: int, schedule: dict, optimizer_cfg) -> float:
    """Set every learning rate of ``optimizer`` for ``step``; returns the configured optimizer's (``lr``) one.

    ``schedule``: the keyword arguments of :func:`learning_rate` but ``peak_lr``, which is ``optimizer_cfg.lr``
    (and, for each part the optimizer's schema names in ``part_lrs``, that part's own peak).
    """
    lr = learning_rate(step, peak_lr=optimizer_cfg.lr, **schedule)
    set_learning_rate(optimizer, lr, optimizer_cfg.lr)
    for key in OPTIMIZER_SCHEMAS[optimizer_cfg.name].part_lrs:
        set_part_lr(optimizer, key, learning_rate(step, peak_lr=optimizer_cfg[key], **schedule), lr)
    return lr
