import pytest
import torch

from configs.schema import LrSchedule
from training.schedule import learning_rate, set_learning_rate

ARGS = dict(peak_lr=1.0, min_lr=0.1, warmup_iters=10, decay_iters=110)


@pytest.mark.parametrize("schedule", list(LrSchedule))
def test_warmup_rises_linearly_from_zero(schedule):
    lrs = [learning_rate(s, schedule=schedule, **ARGS) for s in range(11)]
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.5) and lrs[10] == pytest.approx(1.0)


@pytest.mark.parametrize("schedule", [LrSchedule.cosine, LrSchedule.linear, LrSchedule.wsd])
def test_decaying_schedules_end_at_min_lr(schedule):
    assert learning_rate(110, schedule=schedule, **ARGS) == pytest.approx(0.1)
    assert learning_rate(500, schedule=schedule, **ARGS) == pytest.approx(0.1)
    lrs = [learning_rate(s, schedule=schedule, **ARGS) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_cosine_and_linear_midpoints():
    assert learning_rate(60, schedule=LrSchedule.cosine, **ARGS) == pytest.approx(0.55)
    assert learning_rate(60, schedule=LrSchedule.linear, **ARGS) == pytest.approx(0.55)


def test_wsd_holds_the_peak_until_the_cooldown():
    assert learning_rate(89, schedule=LrSchedule.wsd, decay_fraction=0.2, **ARGS) == 1.0
    assert learning_rate(100, schedule=LrSchedule.wsd, decay_fraction=0.2, **ARGS) == pytest.approx(0.55)


def test_constant_stays_at_peak():
    assert learning_rate(1000, schedule=LrSchedule.constant, **ARGS) == 1.0


def test_groups_with_their_own_lr_keep_their_ratio():
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": params[:1], "lr": 1e-3}, {"params": params[1:], "lr": 2e-2}], lr=1e-3)
    set_learning_rate(opt, 5e-4, peak_lr=1e-3)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([5e-4, 1e-2])
