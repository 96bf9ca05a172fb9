"""What a run tells of itself: how far it got (``Progress``), what it trains at its start (``opening_lines``), and
how it ended, in a few lines at its end: steps done, best and final validation loss, where its state lies, and the
commands that resume it and tabulate it."""
import contextlib
import logging
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from training.provenance import describe_launch

log = logging.getLogger("train")
# Set by scripts/reason_last.sh: the file that receives the run's resume line, which the script prints again last.
RESUME_LINE_VARIABLE = "TRAIN_RESUME_LINE_FILE"


@dataclass
class Progress:
    """How far the run got: whether this launch took its run directory over (a launch refused for it, or with
    nothing to do there, did not: it leaves the directory as it was), its last completed training step (what a
    failure record names), the tokens trained on by then, and its newest checkpoint (resumed from, or written by
    this launch: rank 0 alone holds the path of one it wrote)."""

    took_over_run_dir: bool = False
    step: int = 0
    tokens: int = 0
    checkpoint: Path | None = None


def opening_lines(cfg, data_read: dict, launch: dict | None, num_params: int, world_size: int,
                  run_dir: Path) -> list[str]:
    """The lines a launch logs before its first step: the data it reads, the code that runs (``launch``, rank 0
    only), the model and the global batch, and settings that change what a step computes."""
    t = cfg.train
    made_from = f" | made from {data_read['train']['source']}" if data_read["train"]["source"] else ""
    lines = [f"data {cfg.data.name}: " + " | ".join(f"{split} {read['tokens']:,} tokens in {read['shards']} shard(s)"
                                                   for split, read in data_read.items()) + made_from]
    if launch is not None:
        lines.append(f"launch: {describe_launch(launch)}")
    tokens_per_step = t.batch_size * t.block_size * t.grad_accum_steps * world_size
    lines.append(f"model {num_params / 1e6:.2f}M parameters | {world_size} processes | global batch {tokens_per_step} "
                 f"tokens ({t.batch_size} x {t.block_size} x {t.grad_accum_steps} accumulation x {world_size} ranks) "
                 f"| run dir {run_dir}")
    if t.grad_multiplier != 1:
        lines.append(f"the optimizer receives {t.grad_multiplier:g} x the mean gradient (train.grad_multiplier), "
                     f"clipped at {t.grad_clip:g}")
    if t.compile:
        lines.append(f"the model runs under torch.compile (mode {t.compile_mode}, train.compile_mode)")
    if t.loss_chunk_size:
        lines.append(f"the loss and its gradients are computed {t.loss_chunk_size} tokens at a time "
                     "(train.loss_chunk_size): the full logits are never held")
    return lines


def closing_summary(records: list[dict], progress: Progress, max_iters: int, run_dir: Path, resume: str,
                    tabulate_dir: Path) -> list[str]:
    """The closing lines of a run whose metrics log holds ``records`` (every launch's, so a resumed run's best
    validation loss may be from before this launch). The step-0 evaluation, the untrained model's, is no best."""
    ended = "finished" if progress.step >= max_iters else "stopped"
    losses = [(r["step"], r["val/loss"]) for r in records if "val/loss" in r and r["step"] > 0]
    if losses:
        best_step, best = min(losses, key=lambda step_loss: step_loss[1])
        final_step, final = losses[-1]
        val = f"val loss best {best:.4f} at step {best_step}, final {final:.4f} at step {final_step}"
    else:
        val = "no val loss logged after step 0"
    again = "resume (raise train.max_iters to train on)" if ended == "finished" else "resume"
    return [f"run {ended} at step {progress.step} of {max_iters} (train.max_iters) | {val}",
            f"last checkpoint: {progress.checkpoint or 'none'} | run dir: {run_dir}",
            f"{again}: {resume}",
            # This interpreter by its path, as the resume line starts it, and the runs by theirs: it runs as printed in
            # a shell without the venv activated, from any directory (scripts is a package of the install).
            f"table: {shlex.join([sys.executable, '-m', 'scripts.make_table', os.path.abspath(tabulate_dir)])}"]


def tell_closing_summary(lines: list[str]) -> None:
    """Log the closing lines; of a run that stopped before its end (``resume: ...``), hand the resume line to the
    launch script that asked for it: torchrun ends a Ctrl-C or a SIGTERM with its own traceback, after which the
    script prints the line again."""
    for line in lines:
        log.info(line)
    path, stopped = os.environ.get(RESUME_LINE_VARIABLE), [line for line in lines if line.startswith("resume: ")]
    if path and stopped:
        with contextlib.suppress(OSError):  # the line is in the log already
            Path(path).write_text(f"{stopped[0]}\n")
