"""An optimizer that evaluates at other weights than it trains at (training/eval_weights.py): the trainer logs the
validation loss at its evaluation weights, checkpoints them for evaluation, and trains on from its training weights
as if it had not evaluated."""
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from data.loader import build_batches
from evaluation.checkpoints import model_from_state
from training.distributed import DistributedContext
from training.metrics import read_metrics
from training.runtime import autocast_context
from training.validation import estimate_val_loss
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ["optimizer=adamw", "train.max_iters=6", "train.eval_interval=3", "train.log_interval=1",
             "train.eval_iters=2", "train.batch_size=4", "train.block_size=32", "train.warmup_iters=1",
             "train.checkpoint_interval=6"]


def run(tmp_path, name, *launcher):
    run_dir = tmp_path / name
    launch = warm_python.run([sys.executable, *launcher, *OVERRIDES, f"hydra.run.dir={run_dir}"], cwd=REPO,
                             timeout=600)
    assert launch.returncode == 0, launch.stderr
    records = read_metrics(run_dir)
    train_losses = [(r["step"], r["train/loss"]) for r in records if "train/loss" in r]
    val_losses = {r["step"]: r["val/loss"] for r in records if "val/loss" in r}
    return run_dir, train_losses, val_losses


def val_loss_of(state, run_dir):
    """The validation loss train.py computes, of the weights ``model_from_state`` reads from a checkpoint."""
    cfg = OmegaConf.create(state["config"])
    model = model_from_state(state, run_dir / "checkpoints" / "ckpt_00000006.pt")
    val = build_batches(cfg.data, "val", batch_size=4, block_size=32, grad_accum_steps=1, seed=0, rank=0,
                        world_size=1, device=torch.device("cpu"), vocab_size=cfg.model.vocab_size)
    return estimate_val_loss(model, val, 2, autocast_context(torch.device("cpu"), torch.float32),
                             DistributedContext())


@pytest.mark.slow
def test_validation_runs_at_the_averaged_weights_and_training_goes_on_from_the_training_weights(tmp_path):
    _, plain_train, plain_val = run(tmp_path, "plain", "train.py")
    run_dir, train_losses, val_losses = run(tmp_path, "averaging", "-m", "tests.training.averaging_train")
    assert train_losses == plain_train and len(train_losses) == 6  # every step bit for bit: evaluating changed none
    assert val_losses[0] == plain_val[0]  # no average before the first step
    assert all(val_losses[step] != plain_val[step] for step in (3, 6))
    state = torch.load(run_dir / "checkpoints" / "ckpt_00000006.pt", weights_only=False)
    averaged = val_loss_of(state, run_dir)
    assert averaged == pytest.approx(val_losses[6], rel=1e-6)
    assert val_loss_of({**state, "eval_model": state["model"]}, run_dir) == pytest.approx(plain_val[6], rel=1e-6)


SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.device=cpu"]


def averaging_on_two_ranks(run_dir, *overrides):
    """The averaging run as two data-parallel ranks (forked as srun would start them: ``warm_python.run_ranks``)."""
    ranks = warm_python.run_ranks([sys.executable, "-m", "tests.training.averaging_train", *OVERRIDES, *SMALL,
                                   *overrides, f"hydra.run.dir={run_dir}"], world_size=2, cwd=REPO, timeout=600)
    for rank in ranks:
        assert rank.returncode == 0, rank.stderr
    val_losses = [r["val/loss"] for r in read_metrics(run_dir) if "val/loss" in r]
    return val_losses, torch.load(run_dir / "checkpoints" / "ckpt_00000006.pt", weights_only=False)


@pytest.mark.slow
def test_zero1_evaluates_every_shard_at_its_owners_averaged_weights_as_ddp_does(tmp_path):
    ddp_val, ddp = averaging_on_two_ranks(tmp_path / "ddp")
    zero1_val, zero1 = averaging_on_two_ranks(tmp_path / "zero1", "train.zero1=true")
    assert zero1_val == pytest.approx(ddp_val, rel=1e-6)
    for name, tensor in ddp["eval_model"].items():
        torch.testing.assert_close(zero1["eval_model"][name], tensor, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(zero1["model"][name], ddp["model"][name], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(ddp["eval_model"][name], ddp["model"][name]) for name in ddp["model"])
