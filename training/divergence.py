"""Stop on a non-finite loss or gradient norm, or skip up to a set number of such steps first; never save a
checkpoint whose weights or optimizer state are not finite."""
import logging
import math

import torch

log = logging.getLogger(__name__)


AFTER_DIVERGENCE = "Lower optimizer.lr or raise train.warmup_iters, then resume with those changes added to"


class TrainingDiverged(RuntimeError):
    pass


class DivergenceGuard:
    """Decides, step by step, whether the update may be applied.

    A step whose loss or gradient norm is NaN/inf is skipped (its gradient dropped, the data and the schedule
    moving on) while fewer than ``max_skipped_steps`` have been skipped in the run so far; the next one stops
    the run with a message naming the step and the last good checkpoint. ``skipped_steps`` travels in the
    checkpoint, so a resumed run keeps counting.
    """

    def __init__(self, max_skipped_steps: int = 0, skipped_steps: int = 0, resume: str = "train.resume=true"):
        self.max_skipped_steps, self.skipped_steps = max_skipped_steps, skipped_steps
        self.resume = resume  # the command that resumes the run, for the message that stops it

    def allows_update(self, step: int, loss: float, grad_norm: float, checkpoint_path=None,
                      lookahead_grad_norm: float = 0.0) -> bool:
        """False to skip this step's update; raises TrainingDiverged when no skip is left.

        ``lookahead_grad_norm``: exact MARS's extra gradient, which the next update corrects against.
        """
        if math.isfinite(loss) and math.isfinite(grad_norm) and math.isfinite(lookahead_grad_norm):
            return True
        if not math.isfinite(lookahead_grad_norm):
            grad_norm = f"{grad_norm} (look-ahead gradient norm {lookahead_grad_norm})"
        if self.skipped_steps >= self.max_skipped_steps:
            skipped = f" after skipping {self.skipped_steps} such step(s)" if self.skipped_steps else ""
            raise TrainingDiverged(
                f"non-finite training loss {loss} / gradient norm {grad_norm} at step {step}{skipped}; "
                f"last good checkpoint: {checkpoint_path or 'none written yet'}. {AFTER_DIVERGENCE}: "
                f"{self.resume}"
            )
        self.skipped_steps += 1
        log.warning("non-finite training loss %s / gradient norm %s at step %d: update skipped (%d of "
                    "train.max_skipped_steps=%d)", loss, grad_norm, step, self.skipped_steps,
                    self.max_skipped_steps)
        return False


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


def non_finite_state_message(step: int, names: list[str], checkpoint_path, resume: str) -> str:
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return (f"the state after step {step} holds non-finite values ({listed}): its checkpoint is not written, so "
            f"that no resume starts from it; last good checkpoint: {checkpoint_path or 'none written yet'}. "
            f"{AFTER_DIVERGENCE}: {resume}")
