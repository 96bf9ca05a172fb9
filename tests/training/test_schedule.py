import pytest
import torch
from omegaconf import OmegaConf

from configs.schema import LrSchedule
from mars import Muon
from training.schedule import apply_schedule, learning_rate, set_learning_rate

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


def test_muon_adamw_part_warms_up_in_proportion_then_decays_to_the_same_min_lr_as_muon():
    # The authors' trainer: each optimizer's lr = min_lr + coeff * (its own peak - min_lr) after warmup.
    cfg = OmegaConf.create({"name": "muon", "lr": 2e-2, "adamw_lr": 3e-3})
    muon = Muon([torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))], lr=2e-2,
                adamw_lr=3e-3)
    schedule = dict(min_lr=3e-5, warmup_iters=10, decay_iters=110, schedule=LrSchedule.cosine)

    def lrs(step):
        lr = apply_schedule(muon, step, schedule, cfg)
        group = muon.param_groups[0]
        return lr, group["lr"], group["lr"] * group["adamw_lr_ratio"]

    assert lrs(5) == pytest.approx((1e-2, 1e-2, 1.5e-3))
    coeff = 0.5  # step 60: half-way through the cosine
    assert lrs(60) == pytest.approx((3e-5 + coeff * (2e-2 - 3e-5),) * 2 + (3e-5 + coeff * (3e-3 - 3e-5),))
    assert lrs(110) == pytest.approx((3e-5, 3e-5, 3e-5))
    assert lrs(0)[2] == 0.0
