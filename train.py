"""Train GPT-2 or a LLaMA-style model with AdamW, Muon or MARS on any token-shard corpus. Configured by Hydra (configs/).

    python train.py                                   # tiny GPT-2 on the embedded corpus, CPU, a few minutes
    python train.py model=gpt2-small optimizer=mars-adamw data=openwebtext
    python train.py train.resume=true hydra.run.dir=outputs/my-run   # continue from its latest checkpoint
    torchrun --standalone --nproc_per_node=8 train.py model=gpt2-small ...   # data parallel (DDP)
"""
import contextlib
import logging
import math
import sys
import time
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from configs.compose import ConfigRefused, refuse_config_errors, register_configs, validate
from configs.registry import optimizer_entry
from configs.schema import Draws, grad_accum_steps_for, lr_decay_end
from configs.user_dirs import ConfigSyntaxError, refuse_config_syntax_errors
from data.corpora import take_data_dir_as_custom
from data.loader import TokenBatches, build_batches, draw_as_the_authors
from data.shards import reads_gpt2_tokens
from model import build_model, model_config
from training import memory
from training.distributed import (DistributedContext, all_gather_objects, distributed_session, stop_with_message,
                                  wrap_data_parallel)
from training.divergence import DivergenceGuard, ValLossWatch, initial_val_loss, skip_update
from training.eval_weights import evaluation_weights, start_training
from training.finished import finished_step, keep_finished_checkpoints, nothing_left_to_train
from training.hellaswag import training_items
from training.metrics import MetricsLogger, StepWindow, default_run_name, read_metrics
from training.optimizers import (build_optimizer, import_zero_before_the_process_group, local_optimizer, reported_lr,
                                 state_bytes)
from training.preemption import PreemptionSignal, refuse_if_terminated
from training.provenance import code_on_every_rank, launch_record
from training.resume import Resumed, resume_run
from training.run_checkpoint import RunCheckpoints
from training.run_dir import (RunDirectoryLock, locked_run_directory, register_run_dir_resolver, write_held_job_log,
                              write_hydra_record)
from training.runtime import autocast_context, peak_flops, resolve_device, resolve_dtype, seed_everything, set_tf32
from training.schedule import apply_schedule, warn_about_schedule_shortfalls
from training.summary import Progress, closing_summary, opening_lines, tell_closing_summary
from training.sweep import (clear_failure, divergence_advice, failures_recorded, in_sweep, on_every_rank_alike,
                            resume_command, stop_alike_on_bad_token_ids, sweep_report)
from training.validation import evaluation_record, hellaswag_accuracy, validation_losses

log = logging.getLogger("train")
VAL_SEED = 0  # every run of a setting, whatever its seed, is evaluated on the same windows (training/validation.py)
register_configs()
register_run_dir_resolver()


@hydra.main(version_base=None, config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with failures_recorded(run_dir, lambda: finished_step(run_dir, cfg.train.max_iters)) as progress:
        train(cfg, run_dir, progress)


def train(cfg: DictConfig, run_dir: Path, progress: Progress) -> None:
    refuse_if_terminated(run_dir, resume_command())  # a signal stopped an earlier point of this process's sweep
    validate(cfg)
    take_data_dir_as_custom(cfg.data)
    t = cfg.train
    if t.zero1:
        import_zero_before_the_process_group()
    with (distributed_session(resolve_device(t.device), t.distributed_timeout_s) as ctx,
          locked_run_directory(run_dir, t.resume, t.overwrite, ctx) as lock, PreemptionSignal() as preemption):
        train_loop(cfg, run_dir, ctx, preemption, lock, progress)


def train_loop(cfg: DictConfig, run_dir: Path, ctx: DistributedContext, preemption: PreemptionSignal,
               lock: RunDirectoryLock, progress: Progress) -> None:
    """Set up (or resume), train to ``train.max_iters``, evaluating and checkpointing on the way, and sum up."""
    t, device = cfg.train, ctx.device
    if not ctx.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # one rank speaks for the run
    code, rank_codes = code_on_every_rank(ctx)  # nodes holding different code stop here
    t.grad_accum_steps = grad_accum_steps_for(t, ctx.world_size)  # the checkpoint's config records the result
    if t.resume and nothing_left_to_train(run_dir, cfg, ctx):  # a finished run: nothing is loaded or built
        return
    autocast = autocast_context(device, resolve_dtype(t.dtype, device))
    set_tf32(t.tf32)
    train_batches, val_batches = load_data(cfg, ctx)
    hellaswag_items = training_items(t.hellaswag_file, t.hellaswag_items) if t.hellaswag_interval else []
    model, optimizer = build_model_and_optimizer(cfg, ctx, train_batches)
    config_dict = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    # What this launch reads: the tables tell two corpora (or two samples of one) apart by it, a resume other data.
    data_read = {"train": train_batches.tokens.summary(), "val": val_batches.tokens.summary()}
    resumed = (resume_run(run_dir, t, config_dict, data_read, model, optimizer, train_batches.draws, ctx, progress)
               if t.resume else Resumed())
    start_step = progress.step
    if start_step >= t.max_iters:  # resumed at its end: nothing to train (resume_run said so)
        return
    train_model = wrap_data_parallel(torch.compile(model, mode=t.compile_mode) if t.compile else model, ctx)

    metrics = MetricsLogger(run_dir, cfg.wandb, config_dict, cfg.wandb.run_name or default_run_name(cfg),
                            resumed.wandb_run_id, enabled=ctx.is_main)
    metrics.discard_after(start_step if progress.checkpoint else -1)  # a fresh start keeps nothing of an old log
    take_over_run(cfg, run_dir, ctx, lock, progress, metrics, resumed.changes, data_read,
                  evaluation_record(t.eval_sampling, t.eval_iters, val_batches), (code, rank_codes),
                  model.config.num_params(non_embedding=False))

    tokens_per_step = t.batch_size * t.block_size * t.grad_accum_steps * ctx.world_size
    window = StepWindow(tokens_per_step, t.max_iters, model.config.flops_per_token(t.block_size), peak_flops(device),
                        ctx.world_size, device)
    schedule = dict(min_lr=t.min_lr, warmup_iters=t.warmup_iters, decay_iters=lr_decay_end(t),
                    schedule=t.lr_schedule, decay_fraction=t.decay_fraction)
    guard = DivergenceGuard(t.max_skipped_steps, resumed.skipped_steps, divergence_advice(run_dir))
    watch = ValLossWatch(t.diverged_val_loss_ratio, t.stop_on_diverged_val_loss, guard.advice,
                         initial_val_loss(run_dir, ctx) if progress.checkpoint else None)
    lookahead = getattr(local_optimizer(optimizer), "needs_lookahead_grad", False)

    checkpoints = RunCheckpoints(run_dir, model, optimizer, train_batches.draws, config_dict, data_read,
                                 train_batches.tokens.tokenizer, metrics.wandb_run_id, t.keep_checkpoints, lock, ctx)
    stopped = False
    if not progress.checkpoint:  # a run stopped during its step-0 evaluation resumes with that evaluation logged
        evaluate(train_model, optimizer, train_batches, val_batches, 0, progress, metrics, watch, t, autocast, ctx)
        # A signal during it stops the run at step 0, as its message says, before a step is trained.
        if stopped := signal_on_any_rank(preemption.received, ctx):
            checkpoints.save(progress, guard.skipped_steps, stopping=True)
    for step in range(start_step, start_step if stopped else t.max_iters):
        step_start = time.perf_counter()
        lr = apply_schedule(optimizer, step, schedule, cfg.optimizer)
        step_scalars = compute_gradients(train_model, model, optimizer, train_batches, step, t, autocast, lookahead)
        # The loss is the mean over ranks: what is logged, and a NaN/inf on any rank reaches all of them. Read
        # every step (the step's one host sync) so that a divergence names the exact step it happened at.
        train_loss, grad_norm, lookahead_norm, preempted = read_step_scalars(
            *step_scalars, preemption.received, train_batches, ctx)
        if guard.allows_update(step + 1, train_loss, grad_norm, progress.checkpoint, lookahead_norm):
            with memory.optimizer_state(device):  # allocated in the first step
                optimizer.step()
        else:
            skip_update(optimizer)  # its state as before the step: no checkpoint nor later step sees the skipped one
        optimizer.zero_grad(set_to_none=True)
        progress.tokens += tokens_per_step
        done = progress.step = step + 1
        if step == start_step:  # optimizer state exists from the first step on
            per_rank = ", ".join(f"{b / 2**20:.1f}" for b in all_gather_objects(state_bytes(optimizer), ctx))
            log.info("optimizer state per rank (MiB): %s", per_rank)
        logging_now = done % t.log_interval == 0 or done == t.max_iters
        evaluating = done % t.eval_interval == 0 or done == t.max_iters
        scoring_hellaswag = bool(hellaswag_items) and (done % t.hellaswag_interval == 0 or done == t.max_iters)
        checkpoint_due = done % t.checkpoint_interval == 0 or done == t.max_iters
        if device.type == "cuda" and (logging_now or evaluating or scoring_hellaswag or checkpoint_due or preempted):
            # Only training steps count towards throughput: before anything else starts, this step's queued
            # work (its optimizer step) must be done. Between plain steps the GPU is left to run ahead.
            torch.cuda.synchronize()
        window.add(time.perf_counter() - step_start, clipped=t.grad_clip > 0 and grad_norm > t.grad_clip)

        if logging_now:
            metrics.log(window.record(done, progress.tokens, reported_lr(optimizer, cfg.optimizer, lr), train_loss,
                                      grad_norm, guard.skipped_steps))
        if evaluating:
            evaluate(train_model, optimizer, train_batches, val_batches, done, progress, metrics, watch, t, autocast,
                     ctx)
        if scoring_hellaswag:
            with evaluation_weights(optimizer):  # an averaging optimizer's (training/eval_weights.py)
                metrics.log({"step": done, "tokens": progress.tokens,
                             **hellaswag_accuracy(model, hellaswag_items, autocast, ctx)})
        if (evaluating or scoring_hellaswag) and not preempted:
            # A signal that came during the evaluation stops the run at this step, as its message says, not a step
            # later: the ranks agree on it here (in a step, its all-reduce carries it).
            preempted = signal_on_any_rank(preemption.received, ctx)
        if checkpoint_due or preempted:
            checkpoints.save(progress, guard.skipped_steps, stopping=preempted)
        if preempted:
            break
    metrics.close()
    if ctx.is_main:
        progress.checkpoint = keep_finished_checkpoints(run_dir, progress.step, t, progress.checkpoint)
        tabulate_dir = HydraConfig.get().sweep.dir if in_sweep() else run_dir
        tell_closing_summary(closing_summary(read_metrics(run_dir), progress, t.max_iters, run_dir, resume_command(),
                                             tabulate_dir))
    watch.raise_if_diverged(progress.checkpoint)


def take_over_run(cfg: DictConfig, run_dir: Path, ctx: DistributedContext, lock: RunDirectoryLock, progress: Progress,
                  metrics: MetricsLogger, changes: dict, data_read: dict, evaluation: dict, codes: tuple,
                  num_params: int) -> None:
    """Make this launch the run's (called with the resume accepted and steps to train): its config the run's record,
    its log lines (those held back so far too) the run's log; then record what the launch reads and runs, and open
    the log. ``codes``: this rank's code and every rank's (:func:`code_on_every_rank`)."""
    t = cfg.train
    lock.taken_over = progress.took_over_run_dir = True
    write_held_job_log()
    if ctx.is_main:
        write_hydra_record(run_dir, cfg)
        clear_failure(run_dir)
    if changes:  # the log says from which step on the run ran with which changed settings
        metrics.record({"step": progress.step, "resumed_from": str(progress.checkpoint),
                        "changed": {key: list(values) for key, values in changes.items()}})
    metrics.record_launch(progress.step, "data", data_read)
    metrics.record_launch(progress.step, "evaluation", evaluation)
    # Which code, libraries and hosts ran the steps from here on.
    launch = launch_record(run_dir, progress.step, *codes, ctx.device) if ctx.is_main else None
    if launch is not None:
        metrics.record_launch(progress.step, "launch", launch)
    for line in opening_lines(cfg, data_read, launch, num_params, ctx.world_size, run_dir):
        log.info(line)
    if ctx.is_main:
        warn_about_schedule_shortfalls(t, cfg.optimizer.lr)


def evaluate(model, optimizer, train_batches: TokenBatches, val_batches: TokenBatches, step: int, progress: Progress,
             metrics: MetricsLogger, watch: ValLossWatch, t, autocast, ctx: DistributedContext) -> None:
    """Log the validation losses at ``step``, at the weights the optimizer evaluates at (training/eval_weights.py);
    ``watch`` stops (or marks) a run whose loss rose above step 0's."""
    with evaluation_weights(optimizer):
        losses = validation_losses(model, train_batches, val_batches, t.eval_iters, t.eval_sampling, step, autocast,
                                   ctx)
    metrics.log({"step": step, "tokens": progress.tokens, **losses})
    watch.check(step, losses["val/loss"], progress.checkpoint)


def load_data(cfg: DictConfig, ctx: DistributedContext) -> tuple[TokenBatches, TokenBatches]:
    """This rank's training and validation batches."""
    t = cfg.train
    batch_args = dict(batch_size=t.batch_size, block_size=t.block_size, grad_accum_steps=t.grad_accum_steps,
                      seed=t.seed, rank=ctx.rank, world_size=ctx.world_size, device=ctx.device,
                      vocab_size=cfg.model.vocab_size)
    # Validation windows do not depend on train.seed, so seeds of one setting are scored on the same text.
    train, val = on_every_rank_alike(lambda: (build_batches(cfg.data, "train", **batch_args),
                                              build_batches(cfg.data, "val", **{**batch_args, "seed": VAL_SEED})), ctx)
    tokenizer = train.tokens.tokenizer
    if t.hellaswag_interval and not reads_gpt2_tokens(tokenizer):  # data=c4 is refused at compose; this, any corpus
        raise ValueError(f"train.hellaswag_interval: HellaSwag is scored in GPT-2's tokens, and those of "
                         f"{train.tokens.paths[0].parent} are {tokenizer['name']}'s: set train.hellaswag_interval=0")
    if cfg.data.draws == Draws.authors:
        ahead = optimizer_entry(cfg.optimizer.name).authors_batches_ahead(t.grad_accum_steps)
        draw_as_the_authors(train, val, ahead=ahead, eval_interval=t.eval_interval, seed=t.seed + ctx.rank)
    return train, val


def build_model_and_optimizer(cfg: DictConfig, ctx: DistributedContext,
                              train_batches: TokenBatches) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model, with the same initial weights on every rank, and its optimizer; then each rank's own dropout
    stream.

    Under ``data.draws=authors`` each rank draws its initial weights from train.seed + rank, as the authors'
    trainers do (DDP then gives every rank rank 0's), and the windows continue that generator.
    """
    t = cfg.train
    draws = train_batches.draws
    seed_everything(t.seed + ctx.rank if draws else t.seed)
    config = model_config(OmegaConf.to_container(cfg.model))
    with memory.model_weights(config.num_params(non_embedding=False), ctx.device):
        model = build_model(config).to(ctx.device)
    model.loss_chunk_size = t.loss_chunk_size
    if t.zero1 and not ctx.enabled:
        log.info("train.zero1=true has nothing to shard in a single process: using the plain optimizer")
    optimizer = build_optimizer(cfg.optimizer, model, zero1=t.zero1 and ctx.enabled)
    start_training(optimizer)
    if draws:
        draws.start_after_model_init(torch.get_rng_state())
    seed_everything(t.seed + ctx.rank)
    return model, optimizer


def compute_gradients(train_model, model: torch.nn.Module, optimizer, batches: TokenBatches, step: int, t, autocast,
                      lookahead: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of ``step``, clipped; returns the mean loss, the gradient norm and the look-ahead gradient's
    norm (zero without one), left on the device for ``read_step_scalars``.

    With ``lookahead`` (exact MARS), first the gradient at the current parameters on the next step's batch: the
    remembered gradient that the next step corrects against.
    """
    lookahead_norm = torch.zeros((), device=batches.device)
    with memory.micro_batch(t.batch_size, t.block_size, batches.device):
        if lookahead:
            accumulate_gradients(train_model, batches, step + 1, t.grad_accum_steps, autocast, t.grad_multiplier)
            lookahead_norm = clip_gradients(model, t.grad_clip)
            local_optimizer(optimizer).stash_lookahead_grad()
            optimizer.zero_grad(set_to_none=True)
        loss = accumulate_gradients(train_model, batches, step, t.grad_accum_steps, autocast, t.grad_multiplier)
    return loss, clip_gradients(model, t.grad_clip), lookahead_norm


def accumulate_gradients(model, batches: TokenBatches, step: int, grad_accum_steps: int, autocast,
                         grad_multiplier: float = 1.0) -> torch.Tensor:
    """Forward and backward over this rank's micro-batches of ``step``; returns their mean loss (a float64 scalar
    on the device, left there so that the step reads it in its one host sync: ``read_step_scalars``).

    The gradients add up to ``grad_multiplier`` x the mean gradient over the global batch (DDP averages the
    ranks' gradients), whatever the split into ranks and micro-batches. Under DDP the gradients are all-reduced
    once, on the last micro-batch (``no_sync`` before it).
    """
    # float64: the sum of a few float32 losses is exact there, so it is the same whatever the split into ranks and
    # micro-batches (the ranks' means are summed in float64 too: read_step_scalars).
    total = torch.zeros((), dtype=torch.float64, device=batches.device)
    for micro_step in range(grad_accum_steps):
        x, y = batches.batch(step, micro_step)
        last = micro_step == grad_accum_steps - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast:
                _, loss = model(x, y)
            (loss * (grad_multiplier / grad_accum_steps)).backward()
        total += loss.detach().double()
    return total / grad_accum_steps


def clip_gradients(model, max_norm: float) -> torch.Tensor:
    """Clip to ``max_norm`` (0 disables clipping) and return the pre-clip global gradient norm (on the device)."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)


def signal_on_any_rank(received: bool, ctx: DistributedContext) -> bool:
    """Whether any rank got a termination signal, every rank alike."""
    return any(all_gather_objects(received, ctx)) if ctx.enabled else received


def read_step_scalars(loss: torch.Tensor, grad_norm: torch.Tensor, lookahead_norm: torch.Tensor, preempted: bool,
                      batches: TokenBatches, ctx: DistributedContext) -> tuple[float, float, float, bool]:
    """The step's loss (mean over ranks), gradient norms and whether any rank got a termination signal; every
    rank stops here, before the update, if any rank's batches held a token id beyond the vocabulary.

    One all-reduce and one host sync for them all, instead of one each: the GPU's queue drains only once a step.
    The norms are those of the all-reduced gradients, the same on every rank, so every rank decides alike.
    """
    flags = (float(preempted), float(batches.bad_token_position is not None))
    summed = torch.stack([loss, *(loss.new_full((), flag) for flag in flags)])  # fills: no host-to-device copy
    if ctx.enabled:
        dist.all_reduce(summed)
    loss_sum, preempting_ranks, ranks_with_bad_ids, grad_norm, lookahead_norm = torch.cat(
        [summed, torch.stack([grad_norm, lookahead_norm]).double()]).tolist()
    stop_alike_on_bad_token_ids(batches, ranks_with_bad_ids, ctx)
    return loss_sum / ctx.world_size, grad_norm, lookahead_norm, preempting_ranks > 0


if __name__ == "__main__":
    try:
        refuse_config_syntax_errors(sys.argv[1:])  # Hydra would stop on them with the parser's traceback
        refuse_config_errors(sys.argv[1:])  # Hydra would tell them in several lines, some advising a detour
    except (ConfigSyntaxError, ConfigRefused) as err:
        stop_with_message(f"error: {err}", every_rank_meets_it=True)
    main()
    failed_points = sweep_report()
    if failed_points:
        raise SystemExit("\n".join(failed_points))
