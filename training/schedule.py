"""Learning-rate schedules: warmup, then cosine, linear, constant or warmup-stable-decay down to min_lr."""
import math

from configs.schema import LrSchedule


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
