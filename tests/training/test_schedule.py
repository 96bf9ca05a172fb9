import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from configs.schema import LrSchedule
from mars import MARS, Muon
from mars.optimizer import following_rate
from training.schedule import apply_schedule, learning_rate, schedule_shortfalls, set_learning_rate
from tests import warm_python

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
        return lr, group["lr"], following_rate(group, "adamw_lr")

    assert lrs(5) == pytest.approx((1e-2, 1e-2, 1.5e-3))
    coeff = 0.5  # step 60: half-way through the cosine
    assert lrs(60) == pytest.approx((3e-5 + coeff * (2e-2 - 3e-5),) * 2 + (3e-5 + coeff * (3e-3 - 3e-5),))
    assert lrs(110) == pytest.approx((3e-5, 3e-5, 3e-5))
    assert lrs(0)[2] == 0.0


def test_mars_lr_1d_follows_the_scheduled_lr_at_its_configured_ratio_as_the_authors_lr_1d_factor():
    cfg = OmegaConf.create({"name": "mars", "lr": 6e-3, "lr_1d": 3e-3})
    mars = MARS([torch.nn.Parameter(torch.zeros(2, 2)), torch.nn.Parameter(torch.zeros(2))], lr=6e-3, lr_1d=3e-3)
    schedule = dict(min_lr=3e-5, warmup_iters=10, decay_iters=110, schedule=LrSchedule.cosine)

    def lrs(step):
        lr = apply_schedule(mars, step, schedule, cfg)
        return lr, following_rate(mars.param_groups[0], "lr_1d")

    assert lrs(0) == (0.0, 0.0)
    assert lrs(5) == pytest.approx((3e-3, 1.5e-3))
    assert lrs(110) == pytest.approx((3e-5, 1.5e-5))


REPO = Path(__file__).resolve().parents[2]
TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
        "train.eval_iters=1", "train.device=cpu", "train.max_iters=3", "train.eval_interval=3"]


@pytest.mark.slow
@pytest.mark.parametrize("overrides, says", [
    (["train.warmup_iters=5"], "train.warmup_iters=5 is not below train.max_iters=3: the lr rises for the whole run "
                               "and never reaches its peak optimizer.lr=0.003 (the run ends at train.max_iters=3, "
                               "its last step at lr 0.0012). Lower train.warmup_iters"),
    (["train.warmup_iters=0", "train.lr_schedule=wsd", "train.decay_iters=100"],
     "train.lr_schedule=wsd cools down only from step 80 on (train.decay_iters=100), but the run ends at "
     "train.max_iters=3, its last step at lr 0.003: the lr never leaves its peak. Set train.decay_iters=null"),
    (["train.warmup_iters=0", "train.decay_iters=100"], "the lr decays to train.min_lr=0.0001 at "
                                                        "train.decay_iters=100, but the run ends at train.max_iters=3"),
])
def test_a_run_whose_schedule_the_end_cuts_short_says_so_in_one_line_at_its_start(tmp_path, overrides, says):
    result = warm_python.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path}", *TINY, *overrides], cwd=REPO,
                             timeout=300)
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if "[WARNING]" in line]
    assert says in line, line


@pytest.mark.parametrize("overrides", [{}, {"warmup_iters": 2}, {"lr_schedule": LrSchedule.wsd},
                                       {"lr_schedule": LrSchedule.constant, "decay_iters": 100},
                                       {"decay_iters": 2, "warmup_iters": 1}])
def test_a_schedule_that_fits_its_run_warns_of_nothing(overrides):
    t = OmegaConf.create({"max_iters": 3, "warmup_iters": 0, "decay_iters": None, "lr_schedule": LrSchedule.cosine,
                          "decay_fraction": 0.2, "min_lr": 1e-4, **overrides})
    assert schedule_shortfalls(t, 3e-3) == []
