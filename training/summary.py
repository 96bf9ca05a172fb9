"""How a run ended, in a few lines at its end: steps done, best and final validation loss, where its state lies,
and the commands that resume it and tabulate it."""
import shlex
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Progress:
    """How far the run got: its last completed training step (what a failure record names)."""

    step: int = 0


def closing_summary(records: list[dict], progress: Progress, max_iters: int, checkpoint: Path | None,
                    run_dir: Path, resume: str, tabulate_dir: Path) -> list[str]:
    """The closing lines of a run whose metrics log holds ``records`` (every launch's, so a resumed run's best
    validation loss may be from before this launch)."""
    ended = "finished" if progress.step >= max_iters else "stopped"
    losses = [(r["step"], r["val/loss"]) for r in records if "val/loss" in r]
    if losses:
        best_step, best = min(losses, key=lambda step_loss: step_loss[1])
        final_step, final = losses[-1]
        val = f"val loss best {best:.4f} at step {best_step}, final {final:.4f} at step {final_step}"
    else:
        val = "no val loss logged"
    again = "resume (raise train.max_iters to train on)" if ended == "finished" else "resume"
    return [f"run {ended} at step {progress.step} of {max_iters} (train.max_iters) | {val}",
            f"last checkpoint: {checkpoint or 'none'} | run dir: {run_dir}",
            f"{again}: {resume}",
            f"table: python -m scripts.make_table {shlex.quote(str(tabulate_dir))}"]
