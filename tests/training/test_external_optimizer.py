"""Any installed torch optimizer from one config line (optimizer=external optimizer._target_=...): our parameter
groups, its eval()/train() as its package expects, refusals in one line; through the trainer it trains, evaluates at
its weights, resumes bit for bit, sweeps and is labelled in the tables by its class name."""
import sys
from pathlib import Path

import pytest
import torch

from configs.compose import compose_config, validate
from configs.schema import ConfigError
from model import GPT, GPTConfig
from reporting.run_labels import display_optimizer, optimizer_label
from reporting.run_selection import load_runs
from scripts.make_table import make_table
from tests import warm_python
from training.eval_weights import evaluation_weights, start_training
from training.metrics import read_metrics
from training.optimizers import build_optimizer, reported_lr

REPO = Path(__file__).resolve().parents[2]
SCHEDULE_FREE = "schedulefree.AdamWScheduleFree"
# An optimizer of its own warmup and average, and one of torch's.
EXTERNAL = {SCHEDULE_FREE: ["+optimizer.warmup_steps=2"], "torch.optim.NAdam": []}


def external(target, *overrides):
    cfg = compose_config(["optimizer=external", f"optimizer._target_={target}", "model=tiny", *overrides])
    validate(cfg)
    return cfg


def tiny_model():
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64, bias=True))


def step(model, optimizer):
    idx = torch.randint(0, 64, (2, 8))
    model(idx, idx)[1].backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("target", EXTERNAL)
def test_an_installed_optimizer_takes_our_groups_its_arguments_and_its_class_name_as_label(target):
    cfg = external(target, "optimizer.lr=2e-3", "optimizer.weight_decay=0.2", "+optimizer.betas=[0.8,0.9]")
    optimizer = build_optimizer(cfg.optimizer, tiny_model())
    assert type(optimizer).__module__.split(".")[0] == target.split(".")[0]
    decay, no_decay = optimizer.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert (decay["weight_decay"], no_decay["weight_decay"], decay["lr"], decay["betas"]) == (0.2, 0.0, 2e-3, (0.8, 0.9))
    label = optimizer_label(dict(cfg.optimizer))
    assert label == display_optimizer(label) == target.rpartition(".")[2]


@pytest.mark.parametrize("override, message", [
    ("optimizer._target_=torch.nn.Linear", "^optimizer._target_=torch.nn.Linear is not a torch.optim.Optimizer "
                                           r"class: name one by its import path \(schedulefree"),
    ("optimizer._target_=nowhere.Adam", r"^optimizer._target_=nowhere.Adam cannot be imported \(No module named "
                                        r"'nowhere'\): install its package"),
    ("+optimizer.momentum=0.9", "^optimizer.momentum is not an argument of torch.optim.NAdam: its arguments are "
                                "betas, capturable,"),
    ("optimizer._target_=torch.optim.Rprop", "^optimizer.weight_decay=0.1: torch.optim.Rprop takes no weight decay, "
                                             "set optimizer.weight_decay=0$"),
])
def test_what_is_not_an_installed_optimizer_or_its_argument_is_refused_in_one_line(override, message):
    with pytest.raises(ConfigError, match=message) as refused:
        external("torch.optim.NAdam", override)
    assert "\n" not in str(refused.value)


def test_schedule_free_trains_after_start_training_and_comes_back_from_evaluation_bit_for_bit():
    cfg = external(SCHEDULE_FREE)
    model = tiny_model()
    optimizer = build_optimizer(cfg.optimizer, model)
    with pytest.raises(Exception, match="not in train mode"):  # the package's optimizers start in eval mode
        step(model, optimizer)
    start_training(optimizer)
    for _ in range(3):
        step(model, optimizer)
    assert reported_lr(optimizer, cfg.optimizer, 1.0) == optimizer.param_groups[0]["scheduled_lr"] == cfg.optimizer.lr
    training = [p.detach().clone() for p in model.parameters()]
    with evaluation_weights(optimizer):
        assert any(not torch.equal(p, t) for p, t in zip(model.parameters(), training))  # at its average
    assert all(torch.equal(p, t) for p, t in zip(model.parameters(), training))
    optimizer.eval()
    optimizer.train()  # the package's own round trip: a rounding away (what evaluation_weights undoes)
    assert any(not torch.equal(p, t) for p, t in zip(model.parameters(), training))


TINY = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
        "train.eval_iters=2", "train.warmup_iters=0", "train.lr_schedule=constant", "train.log_interval=1",
        "train.eval_interval=2", "train.checkpoint_interval=2", "train.device=cpu", "optimizer=external"]


def train(*overrides):
    result = warm_python.run([sys.executable, "train.py", *TINY, *overrides], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    return result


def losses(run_dir, key):
    return {r["step"]: r[key] for r in read_metrics(run_dir) if key in r}


@pytest.mark.slow
@pytest.mark.parametrize("target", EXTERNAL)
def test_an_installed_optimizer_trains_evaluates_at_its_weights_resumes_bit_for_bit_and_sweeps(target, tmp_path):
    chosen = [f"optimizer._target_={target}", "optimizer.lr=3e-3", *EXTERNAL[target]]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train(*chosen, "train.max_iters=4", f"hydra.run.dir={whole}")
    train(*chosen, "train.max_iters=2", f"hydra.run.dir={resumed}")
    train(*chosen, "train.max_iters=4", f"hydra.run.dir={resumed}", "train.resume=true")
    assert losses(resumed, "train/loss") == losses(whole, "train/loss") and len(losses(whole, "train/loss")) == 4
    assert losses(resumed, "val/loss") == losses(whole, "val/loss")
    checkpoint = torch.load(whole / "checkpoints" / "ckpt_00000004.pt", weights_only=False)
    if target == SCHEDULE_FREE:  # evaluated at its average, its own warmup's lr logged
        assert any(not torch.equal(checkpoint["eval_model"][key], value) for key, value in checkpoint["model"].items())
        assert losses(whole, "lr")[1] == pytest.approx(1.5e-3) and losses(whole, "lr")[2] == pytest.approx(3e-3)
    else:
        assert checkpoint.get("eval_model") is None and set(losses(whole, "lr").values()) == {3e-3}

    sweep_dir = tmp_path / "sweep"
    result = warm_python.run([sys.executable, "train.py", "-m", *TINY, f"optimizer._target_={target}",
                              *EXTERNAL[target], "optimizer.lr=1e-3,3e-3", "train.max_iters=2",
                              f"hydra.sweep.dir={sweep_dir}"], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    table = make_table(load_runs([str(sweep_dir)]))
    settings = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()
                if line.startswith("| Shakespeare (embedded) |")]
    assert sorted((row[3], row[4]) for row in settings) == [(target.rpartition(".")[2], lr) for lr in ("0.001", "0.003")]
