"""Train GPT-2 with AdamW, Muon or MARS on any token-shard corpus. Configured by Hydra (configs/).

    python train.py                                   # tiny GPT-2 on the embedded corpus, CPU, a few minutes
    python train.py model=gpt2-small optimizer=mars-adamw data=openwebtext
    python train.py train.resume=true hydra.run.dir=outputs/my-run   # continue from its latest checkpoint
    torchrun --standalone --nproc_per_node=8 train.py model=gpt2-small ...   # data parallel (DDP)
"""
import contextlib
import logging
import math
import time
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from configs.schema import ConfigError, grad_accum_steps_for, lr_decay_end, register_configs, validate
from data.corpora import take_data_dir_as_custom
from data.loader import TokenBatches, TokenIdOutOfRange, build_batches
from evaluation.hellaswag import correct_counts, training_items
from model import GPT, GPTConfig
from training.checkpoint import (CheckpointReadError, CheckpointSaveError, UnreadableCheckpoints, checkpoint_step,
                                 latest_checkpoint, save_checkpoint, set_aside_checkpoints_after)
from training.distributed import (DistributedContext, all_gather_objects, distributed_session, stop_with_message,
                                  sum_across_ranks, wrap_data_parallel)
from training.divergence import DivergenceGuard, TrainingDiverged, non_finite_entries, non_finite_state_message
from training.finished import keep_finished_checkpoints, nothing_left_to_train
from training.metrics import MetricsLogger, read_metrics
from training.preemption import PreemptionSignal, TerminatedEarlier, refuse_if_terminated
from training.provenance import DifferentCodeOnRanks, code_on_every_rank, describe_launch, launch_record
from training.resume import check_resumable, config_changes, configured_hyperparameters, restore_hyperparameters
from training.run_dir import RunDirectoryError, RunDirectoryLock, prepare_run_dir, write_hydra_record
from training.optimizers import build_optimizer, full_state_dict, local_optimizer, state_bytes
from training.runtime import (autocast_context, peak_flops, resolve_device, resolve_dtype, rng_state,
                              seed_everything, set_rng_state, set_tf32)
from training.schedule import apply_schedule, warn_about_schedule_shortfalls
from training.validation import validation_losses
from training.summary import Progress, closing_summary
from training.sweep import (clear_failure, in_sweep, point_ended, record_failure, resume_command, sweep_report,
                            write_resume_script)

log = logging.getLogger("train")
VAL_SEED = 0  # every run of a setting, whatever its seed, is evaluated on the same windows (training/validation.py)
register_configs()


def accumulate_gradients(model, batches: TokenBatches, step: int, grad_accum_steps: int, autocast,
                         grad_multiplier: float = 1.0) -> torch.Tensor:
    """Forward and backward over this rank's micro-batches of ``step``; returns their mean loss (a float64 scalar
    on the device, left there so that the step reads it in its one host sync: ``read_step_scalars``).

    The gradients add up to ``grad_multiplier`` x the mean gradient over the global batch (DDP averages the
    ranks' gradients), whatever the split into ranks and micro-batches. Under DDP the gradients are all-reduced
    once, on the last micro-batch (``no_sync`` before it).
    """
    total = torch.zeros((), device=batches.device)
    for micro_step in range(grad_accum_steps):
        x, y = batches.batch(step, micro_step)
        last = micro_step == grad_accum_steps - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            with autocast:
                _, loss = model(x, y)
            (loss * (grad_multiplier / grad_accum_steps)).backward()
        total += loss.detach()
    return total.double() / grad_accum_steps


def clip_gradients(model, max_norm: float) -> torch.Tensor:
    """Clip to ``max_norm`` (0 disables clipping) and return the pre-clip global gradient norm (on the device)."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf)


def read_step_scalars(loss: torch.Tensor, grad_norm: torch.Tensor, lookahead_norm: torch.Tensor, preempted: bool,
                      ctx: DistributedContext) -> tuple[float, float, float, bool]:
    """The step's loss (mean over ranks), gradient norms and whether any rank got a termination signal.

    One all-reduce and one host sync for them all, instead of one each: the GPU's queue drains only once a step.
    The norms are those of the all-reduced gradients, the same on every rank, so every rank decides alike.
    """
    summed = torch.stack([loss, loss.new_full((), float(preempted))])
    if ctx.enabled:
        dist.all_reduce(summed)
    loss_sum, preempting_ranks, grad_norm, lookahead_norm = torch.cat(
        [summed, torch.stack([grad_norm, lookahead_norm]).double()]).tolist()
    return loss_sum / ctx.world_size, grad_norm, lookahead_norm, preempting_ranks > 0


def schedule_changes(saved_train: dict, t) -> list[str]:
    """What a resume changes in the lr schedule's shape: a longer ``max_iters`` stretches the decay."""
    saved_end, end = lr_decay_end(saved_train), lr_decay_end(t)
    if saved_end == end:
        return []
    return [f"the lr schedule now reaches train.min_lr at step {end} instead of the checkpoint's {saved_end} "
            f"(train.max_iters {saved_train['max_iters']} -> {t.max_iters}, train.decay_iters "
            f"{saved_train.get('decay_iters')} -> {t.decay_iters}): from here on the lr differs from the original "
            "run's plan"]


def resume_from(ckpt: dict, checkpoint_path: Path, config_dict: dict, model, optimizer,
                ctx: DistributedContext) -> dict[str, tuple]:
    """Load the checkpoint's weights, optimizer state and random streams; the configured hyperparameters then
    replace the checkpoint's. Returns the settings that differ from the checkpoint's (each one logged).

    Raises :class:`training.resume.ResumeRefused` when a change leaves the state without meaning.
    """
    changes = config_changes(ckpt["config"], config_dict)
    check_resumable(changes, checkpoint_path)
    configured = configured_hyperparameters(optimizer)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    restore_hyperparameters(optimizer, configured)
    rng_states = ckpt["rng"]
    if len(rng_states) == ctx.world_size:
        set_rng_state(rng_states[ctx.rank])
    else:
        log.warning("the checkpoint was written by %d processes, this run has %d: the random streams "
                    "(dropout) restart from train.seed", len(rng_states), ctx.world_size)
    log.info("resumed from %s at step %d", checkpoint_path, ckpt["step"])
    for key, (old, new) in changes.items():
        log.info("changed on resume: %s %r -> %r (from step %d on)", key, old, new, ckpt["step"])
    return changes


def find_resume_checkpoint(run_dir: Path, device: torch.device, ctx: DistributedContext) -> tuple[Path, dict] | None:
    """The newest loadable checkpoint, the same one on every rank, or None; every rank stops alike otherwise.

    A rank that could not read the newest checkpoint (a lagging network file system) would train on from another
    step than the rest; a rank that could read none would stop while the others waited for it.
    """
    found, problem = None, None
    try:
        found = latest_checkpoint(run_dir, device)
    except Exception as err:  # whatever stops this rank (also running out of memory) must stop the others too
        problem = err
    outcomes = all_gather_objects(("error", f"{problem}") if problem else ("found", found and found[0].name), ctx)
    if problem is not None:
        raise problem
    failed = [(rank, message) for rank, (kind, message) in enumerate(outcomes) if kind == "error"]
    if failed:
        rank, message = failed[0]
        raise CheckpointReadError(f"rank {rank} cannot resume: {message}")
    if len({name for _, name in outcomes}) > 1:
        listed = ", ".join(f"rank {rank}: {name or 'none'}" for rank, (_, name) in enumerate(outcomes))
        raise ValueError(f"the ranks found different newest checkpoints in {run_dir} ({listed}): every rank must "
                         "see the same run directory, on a file system they share; check it and resume again")
    return found


def default_run_name(cfg: DictConfig) -> str:
    choices = HydraConfig.get().runtime.choices
    return f"{choices.get('model', 'model')}-{choices.get('optimizer', cfg.optimizer.name)}-{cfg.data.name}"


def lost_work_message(err: CheckpointSaveError, step: int, previous: Path | None) -> str:
    """What failed, what is kept and how many steps a resume repeats."""
    if previous is None:
        kept = f"no earlier checkpoint exists: all {step} steps are lost"
    else:
        kept = (f"the previous checkpoint {previous} is intact: {step - checkpoint_step(previous)} steps are lost "
                "and a resume repeats them")
    return f"{err} (step {step}); {kept}. Free space or fix the directory, then resume: {resume_command()}"


# Faults found alike by every rank (the config, or agreed on by a gather): under torchrun rank 0 alone tells them.
ERRORS_EVERY_RANK_MEETS = (ConfigError, RunDirectoryError, TrainingDiverged, CheckpointSaveError, DifferentCodeOnRanks,
                           TokenIdOutOfRange)


@hydra.main(version_base=None, config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    run_dir, sweep, progress = Path(HydraConfig.get().runtime.output_dir), in_sweep(), Progress()
    if sweep:
        write_resume_script()
    try:
        train(cfg, run_dir, progress)
    except TerminatedEarlier as err:  # a signal stops the whole sweep
        raise SystemExit("\n".join([*sweep_report(), f"error: {err}"])) from None
    except (ValueError, FileNotFoundError, TrainingDiverged, CheckpointSaveError, UnreadableCheckpoints,
            CheckpointReadError) as err:
        # Bad input, divergence and storage faults end the run with their one message, not a traceback.
        end_failed(run_dir, err, f"{err}", progress.step, sweep)
    except Exception as err:
        if not sweep:
            raise
        log.exception("sweep point %s failed", run_dir)  # the traceback goes to its train.log; the sweep goes on
        end_failed(run_dir, err, f"{type(err).__name__}: {err}", progress.step, sweep)
    else:
        if sweep:
            point_ended(run_dir)


def end_failed(run_dir: Path, err: Exception, reason: str, step: int, sweep: bool) -> None:
    """Record the failure in ``run_dir``; a single run stops with its one message, a sweep goes on to its next
    point (and ``sweep_report`` names the failed ones at its end)."""
    record_failure(run_dir, err, reason, step)
    if not sweep:
        stop_with_message(f"error: {reason}", every_rank_meets_it=isinstance(err, ERRORS_EVERY_RANK_MEETS))
    log.error("error: %s", reason)
    point_ended(run_dir, reason)


def train(cfg: DictConfig, run_dir: Path, progress: Progress) -> None:
    refuse_if_terminated(run_dir, resume_command())  # a signal stopped an earlier point of this process's sweep
    validate(cfg)
    take_data_dir_as_custom(cfg.data)
    t = cfg.train
    with (distributed_session(resolve_device(t.device), t.distributed_timeout_s) as ctx,
          run_directory(run_dir, cfg, ctx) as lock, PreemptionSignal() as preemption):
        train_loop(cfg, t, run_dir, ctx, preemption, lock, progress)


@contextlib.contextmanager
def run_directory(run_dir: Path, cfg: DictConfig, ctx: DistributedContext):
    """Rank 0 locks ``run_dir`` for the run's lifetime and checks it; every rank stops alike when the directory
    cannot be used. Yields the lock (held by rank 0 only)."""
    lock = RunDirectoryLock(run_dir)
    problem = None
    if ctx.is_main:
        try:
            lock.acquire()
            prepare_run_dir(run_dir, resume=cfg.train.resume, overwrite=cfg.train.overwrite)
        except RunDirectoryError as err:
            problem = str(err)
    problems = [message for message in all_gather_objects(problem, ctx) if message]
    try:
        if problems:
            raise RunDirectoryError(problems[0])
        yield lock
    finally:
        lock.release()


def train_loop(cfg: DictConfig, t, run_dir: Path, ctx: DistributedContext, preemption: PreemptionSignal,
               lock: RunDirectoryLock, progress: Progress) -> None:
    device = ctx.device
    if not ctx.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # one rank speaks for the run
    code, rank_codes = code_on_every_rank(ctx)  # nodes holding different code stop here
    t.grad_accum_steps = grad_accum_steps_for(t, ctx.world_size)  # the checkpoint's config records the result
    if t.resume and nothing_left_to_train(run_dir, cfg, ctx):  # a finished run: nothing is loaded or built
        return
    dtype = resolve_dtype(t.dtype, device)
    set_tf32(t.tf32)
    autocast = autocast_context(device, dtype)

    batch_args = dict(batch_size=t.batch_size, block_size=t.block_size, grad_accum_steps=t.grad_accum_steps,
                      seed=t.seed, rank=ctx.rank, world_size=ctx.world_size, device=device,
                      vocab_size=cfg.model.vocab_size)
    train_batches = build_batches(cfg.data, "train", **batch_args)
    # Validation windows do not depend on train.seed, so seeds of one setting are scored on the same text.
    val_batches = build_batches(cfg.data, "val", **{**batch_args, "seed": VAL_SEED})
    hellaswag_items = training_items(t.hellaswag_file, t.hellaswag_items) if t.hellaswag_interval else []

    seed_everything(t.seed)  # the same initial weights on every rank
    model_config = GPTConfig(**OmegaConf.to_container(cfg.model))
    model = GPT(model_config).to(device)
    model.loss_chunk_size = t.loss_chunk_size
    if t.zero1 and not ctx.enabled:
        log.info("train.zero1=true has nothing to shard in a single process: using the plain optimizer")
    optimizer = build_optimizer(cfg.optimizer, model, zero1=t.zero1 and ctx.enabled)
    needs_lookahead = getattr(local_optimizer(optimizer), "needs_lookahead_grad", False)
    seed_everything(t.seed + ctx.rank)  # independent dropout per rank

    start_step, tokens_seen, checkpoint_path, wandb_run_id, skipped_steps = 0, 0, None, None, 0
    config_dict = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    changes = {}
    if t.resume:
        found = find_resume_checkpoint(run_dir, device, ctx)
        if found is None:
            log.warning("train.resume=true but %s has no checkpoint yet: starting from scratch", run_dir)
        else:
            checkpoint_path, ckpt = found
            changes = resume_from(ckpt, checkpoint_path, config_dict, model, optimizer, ctx)
            if ctx.is_main:
                set_aside_checkpoints_after(run_dir, ckpt["step"])
            start_step, tokens_seen, wandb_run_id = ckpt["step"], ckpt["tokens"], ckpt.get("wandb_run_id")
            progress.step = start_step
            skipped_steps = ckpt.get("skipped_steps", 0)
            for message in schedule_changes(ckpt["config"]["train"], t):
                log.warning(message)
    train_model = wrap_data_parallel(torch.compile(model, mode=t.compile_mode) if t.compile else model, ctx)

    metrics = MetricsLogger(run_dir, cfg.wandb, config_dict, cfg.wandb.run_name or default_run_name(cfg),
                            wandb_run_id, enabled=ctx.is_main)
    metrics.discard_after(start_step if checkpoint_path else -1)  # a fresh start keeps nothing of an old log
    if ctx.is_main:
        # Only now, with the resume accepted and steps to train, does this config become the run's record.
        write_hydra_record(run_dir, cfg)
        clear_failure(run_dir)
    if changes:  # the log says from which step on the run ran with which changed settings
        metrics.record({"step": start_step, "resumed_from": str(checkpoint_path),
                        "changed": {key: list(values) for key, values in changes.items()}})
    # What this launch reads: the tables tell two corpora (or two samples of one) apart by it, wherever they lie.
    data_read = {"train": train_batches.tokens.summary(), "val": val_batches.tokens.summary()}
    metrics.record_launch(start_step, "data", data_read)
    metrics.record_launch(start_step, "evaluation", {"sampling": t.eval_sampling.value, "batches": t.eval_iters,
                                                     "windows": t.eval_iters * t.batch_size})
    log.info("data %s: %s", cfg.data.name, " | ".join(
        f"{split} {read['tokens']:,} tokens in {read['shards']} shard(s)" for split, read in data_read.items())
        + (f" | made from {data_read['train']['source']}" if data_read["train"]["source"] else ""))
    if ctx.is_main:  # which code, libraries and hosts ran the steps from here on
        launch = launch_record(run_dir, start_step, code, rank_codes, device)
        metrics.record_launch(start_step, "launch", launch)
        log.info("launch: %s", describe_launch(launch))
    tokens_per_step = t.batch_size * t.block_size * t.grad_accum_steps * ctx.world_size
    flops_peak = peak_flops(device)
    log.info("model %.2fM parameters | %d processes | global batch %d tokens (%d x %d x %d accumulation x %d "
             "ranks) | run dir %s", model_config.num_params(non_embedding=False) / 1e6, ctx.world_size,
             tokens_per_step, t.batch_size, t.block_size, t.grad_accum_steps, ctx.world_size, run_dir)
    if ctx.is_main:
        warn_about_schedule_shortfalls(t, cfg.optimizer.lr)
    if t.grad_multiplier != 1:
        log.info("the optimizer receives %g x the mean gradient (train.grad_multiplier), clipped at %g",
                 t.grad_multiplier, t.grad_clip)
    if t.compile:
        log.info("the model runs under torch.compile (mode %s, train.compile_mode)", t.compile_mode)
    if model.loss_chunk_size:
        log.info("the loss and its gradients are computed %d tokens at a time (train.loss_chunk_size): the full "
                 "logits are never held", model.loss_chunk_size)

    def evaluate(step: int) -> None:
        losses = validation_losses(train_model, val_batches, t.eval_iters, t.eval_sampling, step, autocast, ctx)
        metrics.log({"step": step, "tokens": tokens_seen, **losses})

    def evaluate_hellaswag(step: int) -> None:
        # Each rank scores every world_size-th item; the counts add up to the whole set's.
        counts = correct_counts(model, hellaswag_items[ctx.rank :: ctx.world_size], device, autocast,
                                max_length=model_config.block_size)
        correct, correct_norm = (sum_across_ranks(count, ctx) for count in counts)
        metrics.log({"step": step, "tokens": tokens_seen, "hellaswag/acc": correct / len(hellaswag_items),
                     "hellaswag/acc_norm": correct_norm / len(hellaswag_items)})

    def checkpoint(step: int) -> Path:
        rng_states = all_gather_objects(rng_state(), ctx)
        optimizer_state = full_state_dict(optimizer)
        path, failure, diverged = None, None, None
        if ctx.is_main:
            state = {"model": model.state_dict(), "optimizer": optimizer_state, "step": step,
                     "tokens": tokens_seen, "rng": rng_states, "config": config_dict,
                     "wandb_run_id": metrics.wandb_run_id, "skipped_steps": guard.skipped_steps}
            non_finite = non_finite_entries(state["model"], optimizer_state)
            if non_finite:
                diverged = non_finite_state_message(step, non_finite, checkpoint_path, resume_command())
            else:
                try:
                    lock.hold_on()
                    path = save_checkpoint(run_dir, step, state, keep=t.keep_checkpoints)
                except CheckpointSaveError as err:
                    failure = lost_work_message(err, step, checkpoint_path)
                except RunDirectoryError as err:
                    failure = f"the checkpoint of step {step} was not written: {err}"
        # A gather, not a barrier: nobody moves on (or exits) before the checkpoint is on disk, and a failed
        # or refused save stops every rank.
        outcomes = all_gather_objects((failure, diverged), ctx)
        if any(diverged for _, diverged in outcomes):
            raise TrainingDiverged(next(diverged for _, diverged in outcomes if diverged))
        failures = [failure for failure, _ in outcomes if failure]
        if failures:
            raise CheckpointSaveError(failures[0])
        return path

    schedule = dict(min_lr=t.min_lr, warmup_iters=t.warmup_iters,
                    decay_iters=lr_decay_end(t), schedule=t.lr_schedule,
                    decay_fraction=t.decay_fraction)
    guard = DivergenceGuard(t.max_skipped_steps, skipped_steps, resume_command())
    if start_step == 0:
        evaluate(0)
    window_seconds, window_steps, window_clipped = 0.0, 0, 0
    for step in range(start_step, t.max_iters):
        step_start = time.perf_counter()
        lr = apply_schedule(optimizer, step, schedule, cfg.optimizer)
        lookahead_norm = torch.zeros((), device=device)
        if needs_lookahead:
            # Exact MARS: the gradient at the current parameters on the next step's batch becomes the
            # remembered gradient that the next step corrects against.
            accumulate_gradients(train_model, train_batches, step + 1, t.grad_accum_steps, autocast,
                                 t.grad_multiplier)
            lookahead_norm = clip_gradients(model, t.grad_clip)
            local_optimizer(optimizer).stash_lookahead_grad()
            optimizer.zero_grad(set_to_none=True)
        train_loss = accumulate_gradients(train_model, train_batches, step, t.grad_accum_steps, autocast,
                                          t.grad_multiplier)
        grad_norm = clip_gradients(model, t.grad_clip)
        # The loss is the mean over ranks: what is logged, and a NaN/inf on any rank reaches all of them. Read
        # every step (the step's one host sync) so that a divergence names the exact step it happened at.
        train_loss, grad_norm, lookahead_norm, preempted = read_step_scalars(
            train_loss, grad_norm, lookahead_norm, preemption.received, ctx)
        window_clipped += t.grad_clip > 0 and grad_norm > t.grad_clip
        if guard.allows_update(step + 1, train_loss, grad_norm, checkpoint_path, lookahead_norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += tokens_per_step
        done = progress.step = step + 1
        if step == start_step:  # optimizer state exists from the first step on
            per_rank = ", ".join(f"{b / 2**20:.1f}" for b in all_gather_objects(state_bytes(optimizer), ctx))
            log.info("optimizer state per rank (MiB): %s", per_rank)
        logging_now = done % t.log_interval == 0 or done == t.max_iters
        evaluating = done % t.eval_interval == 0 or done == t.max_iters
        scoring_hellaswag = bool(hellaswag_items) and (done % t.hellaswag_interval == 0 or done == t.max_iters)
        checkpointing = done % t.checkpoint_interval == 0 or done == t.max_iters or preempted
        if device.type == "cuda" and (logging_now or evaluating or scoring_hellaswag or checkpointing):
            # Only training steps count towards throughput: before anything else starts, this step's queued
            # work (its optimizer step) must be done. Between plain steps the GPU is left to run ahead.
            torch.cuda.synchronize()
        window_seconds += time.perf_counter() - step_start
        window_steps += 1

        if logging_now:
            tokens_per_s = window_steps * tokens_per_step / window_seconds
            record = {"step": done, "tokens": tokens_seen, "lr": lr,
                      "train/loss": train_loss,
                      "grad_norm": grad_norm, "clipped": window_clipped / window_steps,
                      "tokens_per_s": tokens_per_s,
                      "step_ms": 1000 * window_seconds / window_steps,
                      # At the recent step time; evaluations and checkpoints come on top.
                      "eta_s": (t.max_iters - done) * window_seconds / window_steps}
            if guard.skipped_steps:
                record["skipped_steps"] = guard.skipped_steps
            if flops_peak:
                record["mfu"] = tokens_per_s / ctx.world_size * model_config.flops_per_token(t.block_size) / flops_peak
            if device.type == "cuda":
                record["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
            metrics.log(record)
            window_seconds, window_steps, window_clipped = 0.0, 0, 0
        if evaluating:
            evaluate(done)
        if scoring_hellaswag:
            evaluate_hellaswag(done)
        if checkpointing:
            checkpoint_path = checkpoint(done)
        if preempted:
            log.warning("stopping after step %d on a termination signal; %s holds the run's state", done,
                        checkpoint_path or "the checkpoint")
            break
    metrics.close()
    if ctx.is_main:
        checkpoint_path = keep_finished_checkpoints(run_dir, progress.step, t, checkpoint_path)
        tabulate_dir = HydraConfig.get().sweep.dir if in_sweep() else run_dir
        for line in closing_summary(read_metrics(run_dir), progress, t.max_iters, checkpoint_path, run_dir,
                                    resume_command(), tabulate_dir):
            log.info(line)


if __name__ == "__main__":
    main()
    failed_points = sweep_report()
    if failed_points:
        raise SystemExit("\n".join(failed_points))
