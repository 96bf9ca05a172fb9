"""data.draws=authors: a real train.py run reads the windows the MARS authors' trainers draw, in their order.

The expected windows come from a transcription of their draw order (AGI-Arena/MARS at 4831e28): seed 5000 +
rank, the model's initialisation (tests/model/test_gpt.py's transcription of their model), the batches drawn
before the loop, then at each step the evaluation (rank 0: the train split, then the val split) followed by the
batches that replace those the step reads. The runs train at a learning rate too small to move a float32
weight, so every logged loss is the initial model's loss on the windows of its step: a window drawn out of
order changes it.
"""
import sys
import random
from collections import deque
from pathlib import Path

import pytest
import torch

from data.embedded import prepare_embedded
from data.loader import load_split
from model import GPT, GPTConfig
from tests.model.test_gpt import initial_weights_in_the_authors_order
from training.metrics import read_metrics
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
BATCH, BLOCK, ACCUMULATION, EVAL_ITERS, EVAL_INTERVAL, STEPS = 2, 32, 2, 2, 2, 4
MODEL = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=256, vocab_size=50304,
                  scale_attn_by_inverse_layer_idx=True, activation="gelu_tanh")
FROZEN = ["optimizer.lr=1e-30", "train.min_lr=0", "train.warmup_iters=0"]  # no float32 weight moves
SETTINGS = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.dropout=0.0", f"train.batch_size={BATCH}",
            f"train.block_size={BLOCK}", f"train.grad_accum_steps={ACCUMULATION}", f"train.eval_iters={EVAL_ITERS}",
            f"train.eval_interval={EVAL_INTERVAL}", f"train.max_iters={STEPS}", "train.log_interval=1",
            "train.seed=5000", "train.device=cpu", "data.draws=authors", "train.eval_sampling=fresh",
            "wandb.mode=disabled"]


def their_windows(train, val, ahead: int, rank: int = 0, by_shard: bool = False):
    """(the window starts of each step's micro-batches, {step: (train-split starts, val-split starts)}) as their
    trainer draws them: ``ahead`` batches before the loop (MARS, MARS-M: a step's; AdamW, Muon, Moonlight: one),
    each micro-batch then read from the front of that queue and replaced by a new draw at its back. ``by_shard``:
    their FineWeb-Edu trainers, which pick each training batch's shard with Python's generator and draw the val
    batches from the first val shard (MARS/train_mars_fw.py:135-149)."""
    initial_weights_in_the_authors_order(MODEL, seed=5000 + rank)  # seeds, and draws as their GPT(...) does
    shard_picker = random.Random(5000 + rank)

    def draw(tokens, shard=None):
        begin, length = (0, len(tokens)) if shard is None else (int(tokens.starts[shard]), len(tokens.shards[shard]))
        return begin + torch.randint(length - BLOCK, (BATCH,))

    def draw_train():
        return draw(train, shard_picker.choice(range(len(train.shards))) if by_shard else None)

    queue = deque(draw_train() for _ in range(ahead))
    steps, evaluations = [], {}
    for step in range(STEPS + 1):
        if step % EVAL_INTERVAL == 0 and rank == 0:
            evaluations[step] = ([draw_train() for _ in range(EVAL_ITERS)],
                                 [draw(val, 0 if by_shard else None) for _ in range(EVAL_ITERS)])
        micro_batches = []
        for _ in range(ACCUMULATION):
            micro_batches.append(queue.popleft())
            queue.append(draw_train())
        steps.append(micro_batches)
    return steps, evaluations


def losses_on(model, tokens, starts_per_batch) -> list[torch.Tensor]:
    losses = []
    for starts in starts_per_batch:
        windows = torch.stack([torch.from_numpy(tokens.read(int(s), BLOCK + 1).astype("int64")) for s in starts])
        losses.append(model(windows[:, :-1].contiguous(), windows[:, 1:].contiguous())[1])
    return losses


def step_loss(model, tokens, micro_batches) -> float:
    """A step's training loss as the loop sums it: in float64 over the micro-batches, then their mean."""
    total = torch.zeros((), dtype=torch.float64)
    for loss in losses_on(model, tokens, micro_batches):
        total += loss.double()
    return (total / ACCUMULATION).item()


@torch.no_grad()
def expected_metrics(ahead: int, world_size: int = 1, corpus: Path | None = None) -> tuple[dict, dict]:
    """({step: train/loss}, {step: (train/loss_estimate, val/loss)}) of the initial model on their windows: the
    training loss the mean over the ranks, the estimates rank 0's. A ``corpus`` of several shards is drawn as their
    FineWeb-Edu trainers draw (by shard); the embedded corpus as their OpenWebText trainers."""
    by_shard = corpus is not None
    corpus = corpus or prepare_embedded()
    train, val = load_split(corpus, "train", MODEL.vocab_size), load_split(corpus, "val", MODEL.vocab_size)
    windows = [their_windows(train, val, ahead, rank, by_shard) for rank in range(world_size)]
    torch.manual_seed(5000)  # rank 0's weights, which DDP hands every rank
    model = GPT(MODEL)
    train_losses = {step + 1: sum(step_loss(model, train, steps[step]) for steps, _ in windows) / world_size
                    for step in range(STEPS)}
    estimates = {step: (torch.stack(losses_on(model, train, train_starts)).mean().item(),
                        torch.stack(losses_on(model, val, val_starts)).mean().item())
                 for step, (train_starts, val_starts) in windows[0][1].items()}
    return train_losses, estimates


def run(run_dir, *overrides, ranks=1) -> list[dict]:
    """train.py in one process, or as ``ranks`` data-parallel ranks (forked: ``warm_python.run_ranks``)."""
    command = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SETTINGS, *overrides]
    results = (warm_python.run_ranks(command, world_size=ranks, cwd=REPO, timeout=600) if ranks > 1 else
               [warm_python.run(command, cwd=REPO, timeout=600)])
    for result in results:
        assert result.returncode == 0, result.stderr
    return read_metrics(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, ahead", [
    (["optimizer=mars-adamw", "optimizer.lr_1d=1e-30"], ACCUMULATION),  # MARS/train_mars.py:275-280
    (["optimizer=mars-adamw", "optimizer.lr_1d=1e-30", "optimizer.is_approx=false"], ACCUMULATION),
    (["optimizer=adamw"], 1),  # MARS/train_adamw.py:263
], ids=["mars-approx", "mars-exact-lookahead", "adamw"])
def test_a_run_reads_the_windows_their_trainer_draws_in_their_order(tmp_path, optimizer, ahead):
    records = run(tmp_path, *optimizer, *FROZEN)
    train_losses, estimates = expected_metrics(ahead)
    assert {r["step"]: r["train/loss"] for r in records if "train/loss" in r} == train_losses
    logged = {r["step"]: (r["train/loss_estimate"], r["val/loss"]) for r in records if "val/loss" in r}
    assert logged == estimates


@pytest.mark.slow
def test_under_ddp_each_rank_draws_from_its_own_seed_and_rank_0_alone_evaluates(tmp_path):
    records = run(tmp_path, "optimizer=mars-adamw", "optimizer.lr_1d=1e-30", *FROZEN, ranks=2)
    train_losses, estimates = expected_metrics(ACCUMULATION, world_size=2)
    assert {r["step"]: r["train/loss"] for r in records if "train/loss" in r} == train_losses
    assert {r["step"]: (r["train/loss_estimate"], r["val/loss"]) for r in records if "val/loss" in r} == estimates


@pytest.mark.slow
def test_by_shard_each_training_batch_picks_its_shard_as_their_fineweb_edu_trainer(tmp_path, prepared_dir):
    records = run(tmp_path, "optimizer=mars-adamw", "optimizer.lr_1d=1e-30", *FROZEN, "data=custom",
                  f"data.dir={prepared_dir}", "data.sampling=random_shard")
    train_losses, estimates = expected_metrics(ACCUMULATION, corpus=prepared_dir)
    assert {r["step"]: r["train/loss"] for r in records if "train/loss" in r} == train_losses
    assert {r["step"]: (r["train/loss_estimate"], r["val/loss"]) for r in records if "val/loss" in r} == estimates
