"""Train GPT-2 with AdamW, Muon or MARS on any token-shard corpus. Configured by Hydra (configs/).

    python train.py                                   # tiny GPT-2 on the embedded corpus, CPU, a few minutes
    python train.py model=gpt2-small optimizer=mars-adamw data=openwebtext
    python train.py train.resume=true hydra.run.dir=outputs/my-run   # continue from its latest checkpoint
"""
import logging
import math
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from configs.schema import register_configs, validate
from data.loader import TokenBatches, build_batches
from model import GPT, GPTConfig
from training.checkpoint import latest_checkpoint, save_checkpoint
from training.metrics import MetricsLogger
from training.optimizers import build_optimizer
from training.runtime import (autocast_context, peak_flops, resolve_device, resolve_dtype, rng_state,
                              seed_everything, set_rng_state)
from training.schedule import learning_rate, set_learning_rate

log = logging.getLogger("train")
register_configs()


class TrainingDiverged(RuntimeError):
    pass


def accumulate_gradients(model, batches: TokenBatches, step: int, grad_accum_steps: int, autocast) -> float:
    """Forward and backward over the micro-batches of ``step``; returns the mean loss."""
    total = 0.0
    for micro_step in range(grad_accum_steps):
        x, y = batches.batch(step, micro_step)
        with autocast:
            _, loss = model(x, y)
        (loss / grad_accum_steps).backward()
        total += loss.item()
    return total / grad_accum_steps


def clip_gradients(model, max_norm: float) -> float:
    """Clip to ``max_norm`` (0 disables clipping) and return the pre-clip global gradient norm."""
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm if max_norm > 0 else math.inf).item()


@torch.no_grad()
def estimate_val_loss(model, batches: TokenBatches, eval_iters: int, autocast) -> float:
    """Mean loss over the same ``eval_iters`` validation batches at every evaluation (comparable curves)."""
    model.eval()
    losses = []
    for k in range(eval_iters):
        x, y = batches.batch(step=0, micro_step=k)
        with autocast:
            _, loss = model(x, y)
        losses.append(loss.item())
    model.train()
    return sum(losses) / len(losses)


def default_run_name(cfg: DictConfig) -> str:
    choices = HydraConfig.get().runtime.choices
    return f"{choices.get('model', 'model')}-{choices.get('optimizer', cfg.optimizer.name)}-{cfg.data.name}"


@hydra.main(version_base=None, config_path="configs", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        train(cfg)
    except (ValueError, FileNotFoundError, TrainingDiverged) as err:
        # Bad input and divergence end the run with their one message, not a traceback to dig through.
        raise SystemExit(f"error: {err}") from None


def train(cfg: DictConfig) -> None:
    validate(cfg)
    t = cfg.train
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    device = resolve_device(t.device)
    dtype = resolve_dtype(t.dtype, device)
    autocast = autocast_context(device, dtype)
    seed_everything(t.seed)

    batch_args = dict(batch_size=t.batch_size, block_size=t.block_size, grad_accum_steps=t.grad_accum_steps,
                      seed=t.seed, rank=0, world_size=1, device=device, vocab_size=cfg.model.vocab_size)
    train_batches = build_batches(cfg.data, "train", **batch_args)
    val_batches = build_batches(cfg.data, "val", **batch_args)

    model_config = GPTConfig(**OmegaConf.to_container(cfg.model))
    model = GPT(model_config).to(device)
    optimizer = build_optimizer(cfg.optimizer, model)
    needs_lookahead = getattr(optimizer, "needs_lookahead_grad", False)

    start_step, tokens_seen, checkpoint_path, wandb_run_id = 0, 0, None, None
    if t.resume:
        found = latest_checkpoint(run_dir, device)
        if found is None:
            log.info("train.resume=true but %s has no checkpoint yet: starting from scratch", run_dir)
        else:
            checkpoint_path, ckpt = found
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            set_rng_state(ckpt["rng"])
            start_step, tokens_seen, wandb_run_id = ckpt["step"], ckpt["tokens"], ckpt.get("wandb_run_id")
            log.info("resumed from %s at step %d", checkpoint_path, start_step)
    train_model = torch.compile(model) if t.compile else model

    config_dict = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    metrics = MetricsLogger(run_dir, cfg.wandb, config_dict, cfg.wandb.run_name or default_run_name(cfg),
                            wandb_run_id)
    metrics.discard_after(start_step)
    tokens_per_step = t.batch_size * t.block_size * t.grad_accum_steps
    flops_peak = peak_flops(device)
    log.info("model %.2fM parameters | %d tokens per step | run dir %s",
             model_config.num_params(non_embedding=False) / 1e6, tokens_per_step, run_dir)

    def evaluate(step: int) -> None:
        val_loss = estimate_val_loss(train_model, val_batches, t.eval_iters, autocast)
        metrics.log({"step": step, "tokens": tokens_seen, "val/loss": val_loss})

    def checkpoint(step: int) -> Path:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                 "tokens": tokens_seen, "rng": rng_state(), "config": config_dict,
                 "wandb_run_id": metrics.wandb_run_id}
        return save_checkpoint(run_dir, step, state, keep=t.keep_checkpoints)

    schedule = dict(peak_lr=cfg.optimizer.lr, min_lr=t.min_lr, warmup_iters=t.warmup_iters,
                    decay_iters=t.decay_iters or t.max_iters, schedule=t.lr_schedule,
                    decay_fraction=t.decay_fraction)
    if start_step == 0:
        evaluate(0)
    window_seconds, window_steps = 0.0, 0
    for step in range(start_step, t.max_iters):
        step_start = time.perf_counter()
        lr = learning_rate(step, **schedule)
        set_learning_rate(optimizer, lr, cfg.optimizer.lr)
        if needs_lookahead:
            # Exact MARS: the gradient at the current parameters on the next step's batch becomes the
            # remembered gradient that the next step corrects against.
            accumulate_gradients(train_model, train_batches, step + 1, t.grad_accum_steps, autocast)
            clip_gradients(model, t.grad_clip)
            optimizer.stash_lookahead_grad()
            optimizer.zero_grad(set_to_none=True)
        train_loss = accumulate_gradients(train_model, train_batches, step, t.grad_accum_steps, autocast)
        grad_norm = clip_gradients(model, t.grad_clip)
        # Checked every step (one host sync) so that a divergence names the exact step it happened at.
        if not (math.isfinite(train_loss) and math.isfinite(grad_norm)):
            raise TrainingDiverged(
                f"non-finite training loss {train_loss} / gradient norm {grad_norm} at step {step + 1}; "
                f"last good checkpoint: {checkpoint_path or 'none written yet'}. Lower optimizer.lr or "
                "raise train.warmup_iters, then resume with train.resume=true"
            )
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens_seen += tokens_per_step
        done = step + 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        # Only training steps count towards throughput: evaluation and checkpointing are left out.
        window_seconds += time.perf_counter() - step_start
        window_steps += 1

        if done % t.log_interval == 0 or done == t.max_iters:
            tokens_per_s = window_steps * tokens_per_step / window_seconds
            record = {"step": done, "tokens": tokens_seen, "lr": lr, "train/loss": train_loss,
                      "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                      "step_ms": 1000 * window_seconds / window_steps}
            if flops_peak:
                record["mfu"] = tokens_per_s * model_config.flops_per_token(t.block_size) / flops_peak
            metrics.log(record)
            window_seconds, window_steps = 0.0, 0
        if done % t.eval_interval == 0 or done == t.max_iters:
            evaluate(done)
        if done % t.checkpoint_interval == 0 or done == t.max_iters:
            checkpoint_path = checkpoint(done)
    metrics.close()


if __name__ == "__main__":
    main()
