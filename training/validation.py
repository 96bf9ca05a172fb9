"""What an evaluation during training scores: the validation loss (which windows, and the mean loss over them), and
HellaSwag accuracy.

Three procedures (``train.eval_sampling``):

- ``fixed``: the same ``eval_iters`` batches at every evaluation, the windows of step 0. Curves are smooth and
  the seeds of a setting are scored on one text.
- ``fresh``: new windows at every evaluation, keyed by the evaluation's step (a resumed run scores the windows
  the uninterrupted one would have), shared out across the ranks. Under ``data.draws=authors`` (the paper
  presets) they are instead the windows of the MARS authors' ``estimate_loss`` (``MARS/train_mars.py:235-248``),
  drawn by their generator in their order (``data/authors_draws.py``) and scored by rank 0 alone:
  ``eval_iters`` batches of the train split (``train/loss_estimate``), then of the val split (``val/loss``).
  The best val loss is then the minimum over these noisy estimates; that the paper's table reports that minimum
  is an assumption (docs/paper.md). A run evaluated on fresh windows also scores the fixed ones
  (``val/loss_fixed``).
- ``whole``: every window of the validation split once (a corpus of rows: every row), shared out across the
  ranks; the loss is the mean over every target token scored (a row's padding is not), as GaLore's evaluation
  on C4 (``torchrun_main.py:84-126``, which averages its batches' means instead: docs/c4.md), and its exponential,
  ``val/perplexity``, is the figure their tables report.

The fixed and keyed fresh windows are drawn from the validation batches' generator, keyed independently of
``train.seed``, so the seeds of a setting (and every optimizer) are scored on the same windows at the same step.
"""
import math

import numpy as np
import torch

from configs.schema import EvalSampling
from data.loader import TokenBatches
from model.loss import IGNORED_TARGET
from training import memory
from training.distributed import DistributedContext, sums_across_ranks
from training.hellaswag import correct_counts
from training.sweep import stop_alike_on_bad_token_ids

FIXED_WINDOWS_STEP = 0  # the fixed windows are those the validation generator draws for step 0


@torch.no_grad()
def estimate_val_loss(model, batches: TokenBatches, eval_iters: int, autocast, ctx: DistributedContext,
                      window_step: int = FIXED_WINDOWS_STEP) -> float:
    """Mean loss over the ``eval_iters`` validation batches that the generator draws for ``window_step``.

    The batches are shared out across ranks (global batch k*world_size + rank), so the result does not depend
    on the number of processes.
    """
    model.eval()
    # float64, as the sum across ranks: exact for a few float32 losses, so the same whatever the number of ranks.
    total = torch.zeros((), dtype=torch.float64, device=batches.device)
    local_batches = range(math.ceil((eval_iters - ctx.rank) / ctx.world_size))
    for k in local_batches:
        x, y = batches.batch(step=window_step, micro_step=k)
        with memory.micro_batch(batches.batch_size, batches.block_size, batches.device), autocast:
            _, loss = model(x, y)
        total += loss.double()
    model.train()
    met_bad_ids = float(batches.bad_token_position is not None)
    loss_sum, ranks_with_bad_ids = sums_across_ranks([total.item(), met_bad_ids], ctx)
    stop_alike_on_bad_token_ids(batches, ranks_with_bad_ids, ctx)
    return loss_sum / eval_iters


@torch.no_grad()
def whole_split_loss(model, batches: TokenBatches, autocast, ctx: DistributedContext) -> float:
    """Mean loss over every scored target of every window of the split (each window once; the last batch shorter).

    Batch k is scored by rank k % world_size, and each batch's mean is weighted by its scored targets in a float64
    sum across the ranks: the same number whatever the number of processes, up to the order of that sum. The ranks
    score unequal numbers of batches, so the model runs outside DDP (whose forward may broadcast buffers).
    """
    model = getattr(model, "module", model)
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=batches.device)  # loss sum, scored targets
    starts = np.arange(batches.windows_per_epoch) * batches.block_size
    for first in range(ctx.rank * batches.batch_size, len(starts), ctx.world_size * batches.batch_size):
        x, y = batches.batch_at(starts[first:first + batches.batch_size])
        with memory.micro_batch(len(x), batches.block_size, batches.device), autocast:
            _, loss = model(x, y)
        scored = (y != IGNORED_TARGET).sum()
        totals += torch.stack([loss.double() * scored, scored.double()])
    model.train()
    met_bad_ids = float(batches.bad_token_position is not None)
    loss_sum, scored, ranks_with_bad_ids = sums_across_ranks([*totals.tolist(), met_bad_ids], ctx)
    stop_alike_on_bad_token_ids(batches, ranks_with_bad_ids, ctx)
    return loss_sum / scored


def evaluation_record(sampling: EvalSampling, eval_iters: int, val_batches: TokenBatches) -> dict:
    """What every evaluation of a launch scores, for its log: the procedure, its batches and windows."""
    if EvalSampling(sampling) == EvalSampling.whole:
        windows = val_batches.windows_per_epoch
        return {"sampling": "whole", "batches": math.ceil(windows / val_batches.batch_size), "windows": windows}
    return {"sampling": EvalSampling(sampling).value, "batches": eval_iters,
            "windows": eval_iters * val_batches.batch_size}


def validation_losses(model, train_batches: TokenBatches, val_batches: TokenBatches, eval_iters: int,
                      sampling: EvalSampling, step: int, autocast, ctx: DistributedContext) -> dict[str, float]:
    """The evaluation's metrics: ``val/loss`` by the configured procedure, and ``val/loss_fixed`` besides when
    that procedure is ``fresh``; under ``data.draws=authors``, ``val/loss`` and ``train/loss_estimate`` are the
    authors' estimates (``authors_estimates``); ``whole``: ``val/loss`` and ``val/perplexity`` of every window."""
    if EvalSampling(sampling) == EvalSampling.whole:
        loss = whole_split_loss(model, val_batches, autocast, ctx)
        return {"val/loss": loss, "val/perplexity": math.exp(min(loss, 700.0))}
    fixed = estimate_val_loss(model, val_batches, eval_iters, autocast, ctx)
    if EvalSampling(sampling) == EvalSampling.fixed:
        return {"val/loss": fixed}
    if train_batches.draws is not None:
        return {**authors_estimates(model, train_batches, val_batches, eval_iters, step, autocast, ctx),
                "val/loss_fixed": fixed}
    fresh = estimate_val_loss(model, val_batches, eval_iters, autocast, ctx, window_step=step)
    return {"val/loss": fresh, "val/loss_fixed": fixed}


@torch.no_grad()
def authors_estimates(model, train_batches: TokenBatches, val_batches: TokenBatches, eval_iters: int, step: int,
                      autocast, ctx: DistributedContext) -> dict[str, float]:
    """The authors' ``estimate_loss`` (``MARS/train_mars.py:235-248``): rank 0 alone scores ``eval_iters``
    batches of the train split, then ``eval_iters`` of the val split, drawn by its generator in their order
    (``AuthorsDraws.evaluation_starts``); the other ranks draw nothing and wait for the result.

    The train-split figure is ``train/loss_estimate``, apart from the training loss of the steps (``train/loss``).
    """
    losses = torch.zeros(2, eval_iters, device=val_batches.device)  # float32 means, as theirs
    if ctx.is_main:
        model = getattr(model, "module", model)  # rank 0 alone: no DDP forward, which would wait for the others
        model.eval()
        for split, (batches, starts) in enumerate(zip((train_batches, val_batches),
                                                      train_batches.draws.evaluation_starts(step, eval_iters))):
            for k, window_starts in enumerate(starts):
                x, y = batches.batch_at(window_starts)
                with autocast:
                    _, losses[split, k] = model(x, y)
        model.train()
    met_bad_ids = [float(batches.bad_token_position is not None) for batches in (train_batches, val_batches)]
    train_loss, val_loss, *ranks_with_bad_ids = sums_across_ranks([*losses.mean(dim=1).tolist(), *met_bad_ids], ctx)
    for batches, ranks in zip((train_batches, val_batches), ranks_with_bad_ids):
        stop_alike_on_bad_token_ids(batches, ranks, ctx)
    return {"train/loss_estimate": train_loss, "val/loss": val_loss}


def hellaswag_accuracy(model, items: list, autocast, ctx: DistributedContext) -> dict[str, float]:
    """HellaSwag accuracy on ``items``: each rank scores every world_size-th item; the counts add up to the whole
    set's."""
    counts = correct_counts(model, items[ctx.rank :: ctx.world_size], ctx.device, autocast,
                            max_length=model.config.block_size)
    correct, correct_norm = sums_across_ranks(list(counts), ctx)
    return {"hellaswag/acc": correct / len(items), "hellaswag/acc_norm": correct_norm / len(items)}
