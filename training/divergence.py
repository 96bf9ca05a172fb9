"""Stop on a non-finite loss or gradient norm, or skip up to a set number of such steps first; stop (or mark) a run
whose validation loss rose above the untrained model's; never save a checkpoint whose weights or optimizer state
are not finite."""
import logging
import math
from pathlib import Path

import torch

from training.distributed import DistributedContext, all_gather_objects
from training.metrics import RECORD_FORMATS, read_metrics
from training.optimizers import local_optimizer

log = logging.getLogger(__name__)


class TrainingDiverged(RuntimeError):
    """The run diverged at ``step``. The message says how, where its last good checkpoint lies and what to do;
    ``reason`` says how alone, without the step (what ``failure.json`` keeps and a table cell shows)."""

    def __init__(self, reason: str, step: int, checkpoint_path, advice: str):
        super().__init__(f"diverged at step {step}: {reason}; last good checkpoint: "
                         f"{checkpoint_path or 'none written yet'}. {advice}")
        self.reason, self.step = reason, step


class DivergenceGuard:
    """Decides, step by step, whether the update may be applied.

    A step whose loss or gradient norm is NaN/inf is skipped (its gradient dropped, the optimizer's state left as it
    was: :func:`skip_update`; the data and the schedule moving on) while fewer than ``max_skipped_steps`` have been
    skipped in the run so far; the next one stops the run with a message naming what is not finite, the step and
    the last good checkpoint. ``skipped_steps`` travels in the checkpoint, so a resumed run keeps counting.
    ``advice``: what to do then (``training.sweep.divergence_advice``).
    """

    def __init__(self, max_skipped_steps: int = 0, skipped_steps: int = 0, advice: str = ""):
        self.max_skipped_steps, self.skipped_steps, self.advice = max_skipped_steps, skipped_steps, advice

    def allows_update(self, step: int, loss: float, grad_norm: float, checkpoint_path=None,
                      lookahead_grad_norm: float = 0.0) -> bool:
        """False to skip this step's update (then :func:`skip_update`); raises TrainingDiverged when no skip is left.

        ``lookahead_grad_norm``: exact MARS's extra gradient, which the next update corrects against.
        """
        if math.isfinite(loss) and math.isfinite(grad_norm) and math.isfinite(lookahead_grad_norm):
            return True
        reason = non_finite_step_reason(loss, grad_norm, lookahead_grad_norm)
        if self.skipped_steps >= self.max_skipped_steps:
            skipped = f" after skipping {self.skipped_steps} such step(s)" if self.skipped_steps else ""
            raise TrainingDiverged(f"{reason}{skipped}", step, checkpoint_path, self.advice)
        self.skipped_steps += 1
        log.warning("%s at step %d: update skipped (%d of train.max_skipped_steps=%d)", reason, step,
                    self.skipped_steps, self.max_skipped_steps)
        return False


def non_finite_step_reason(loss: float, grad_norm: float, lookahead_grad_norm: float) -> str:
    """Which of a step's loss and gradient norms are not finite, by name, and the finite ones beside them, rounded as
    the log rounds them: ``non-finite gradient norm inf (training loss 5150.9551)``. The look-ahead norm, exact
    MARS's alone, is named only when it is not finite."""
    quantities = [("training loss", loss, RECORD_FORMATS["train/loss"]),
                  ("gradient norm", grad_norm, RECORD_FORMATS["grad_norm"]),
                  ("look-ahead gradient norm", lookahead_grad_norm, RECORD_FORMATS["grad_norm"])]
    non_finite = [f"{name} {value:{fmt}}" for name, value, fmt in quantities if not math.isfinite(value)]
    finite = [f"{name} {value:{fmt}}" for name, value, fmt in quantities[:2] if math.isfinite(value)]
    return f"non-finite {' and '.join(non_finite)}" + (f" ({', '.join(finite)})" if finite else "")


def skip_update(optimizer: torch.optim.Optimizer) -> None:
    """Leave ``optimizer`` as it was before the step whose update the guard refused, so that neither a later step
    nor a checkpoint holds anything of that step: exact MARS's look-ahead gradient, stashed for it, is dropped
    (:meth:`mars.optimizer.LookaheadGradient.discard_lookahead_grad`). The other optimizers change nothing before
    their ``step()``."""
    discard = getattr(local_optimizer(optimizer), "discard_lookahead_grad", None)
    if discard is not None:
        discard()


class ValLossWatch:
    """Marks the run diverged at the first evaluation whose validation loss is above ``ratio`` x the step-0 one,
    the untrained model's: a finite blow-up (lr = 10: 10.8 -> 981), which no NaN reveals. With ``stop`` the run
    stops there; else it trains on and is marked diverged at its end (``raise_if_diverged``)."""

    def __init__(self, ratio: float, stop: bool, advice: str, initial_val_loss: float | None = None):
        self.ratio, self.stop, self.advice = ratio, stop, advice
        self.initial_val_loss = initial_val_loss
        self.divergence: tuple[str, int] | None = None  # (reason, step) of the first evaluation above the limit

    def check(self, step: int, val_loss: float, checkpoint_path=None) -> None:
        if step == 0:
            self.initial_val_loss = val_loss
            return
        limit = None if self.initial_val_loss is None else self.ratio * self.initial_val_loss
        if self.divergence is not None or limit is None or val_loss <= limit:
            return
        reason = (f"val loss {val_loss:.4g}, above {self.ratio:g} x the step-0 val loss {self.initial_val_loss:.4g} "
                  "(train.diverged_val_loss_ratio)" if math.isfinite(val_loss) else f"non-finite val loss {val_loss}")
        self.divergence = (reason, step)
        if self.stop:
            raise TrainingDiverged(*self.divergence, checkpoint_path, self.advice)
        log.warning("diverged at step %d: %s; training on (train.stop_on_diverged_val_loss=false)", step,
                    self.divergence[0])

    def raise_if_diverged(self, checkpoint_path=None) -> None:
        """At the end of a run that trained on past its divergence: mark it diverged all the same."""
        if self.divergence is not None:
            raise TrainingDiverged(*self.divergence, checkpoint_path, self.advice)


def initial_val_loss(run_dir: Path, ctx: DistributedContext) -> float | None:
    """The step-0 validation loss in the run's log (rank 0 reads it; every rank gets it), for a resumed run."""
    read = None
    if ctx.is_main:
        read = next((r["val/loss"] for r in read_metrics(run_dir) if r["step"] == 0 and "val/loss" in r), None)
    return all_gather_objects(read, ctx)[0]


def non_finite_entries(model_state: dict, optimizer_state: dict) -> list[str]:
    """The names of the floating tensors of a checkpoint's model and optimizer state that hold a NaN or an inf.

    An update can turn finite gradients into non-finite weights (an lr far too high); such a state must not be
    saved, where it would replace the good checkpoints and be resumed from.
    """
    named = [(f"model {name}", tensor) for name, tensor in model_state.items()]
    named += [(f"optimizer {key} of parameter {index}", value)
              for index, state in optimizer_state.get("state", {}).items() for key, value in state.items()]
    return [name for name, tensor in named
            if torch.is_tensor(tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


def non_finite_state_reason(names: list[str]) -> str:
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"non-finite values in the state after the step ({listed})"


NOT_CHECKPOINTED = "Its checkpoint is not written, so that no resume starts from it."
