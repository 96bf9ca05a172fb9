"""The run's checkpoint at a step: what it holds, written by rank 0 while it holds the run directory's lock, and
agreed on by every rank before any of them goes on (or stops)."""
import logging
from dataclasses import dataclass
from pathlib import Path

from data.authors_draws import AuthorsDraws
from training.checkpoint import CheckpointSaveError, checkpoint_step, save_checkpoint
from training.distributed import DistributedContext, all_gather_objects
from training.divergence import NOT_CHECKPOINTED, TrainingDiverged, non_finite_entries, non_finite_state_reason
from training.eval_weights import evaluation_state_dict
from training.optimizers import full_state_dict
from training.run_dir import RunDirectoryError, RunDirectoryLock
from training.runtime import rng_state
from training.summary import Progress
from training.sweep import divergence_advice, resume_command

log = logging.getLogger("train")


@dataclass
class RunCheckpoints:
    """What a launch writes its checkpoints from, fixed before its first step (``data_read``: what the launch
    reads, which a resume compares with what it reads); :meth:`save` takes the step's."""
    run_dir: Path
    model: object
    optimizer: object
    draws: AuthorsDraws | None
    config: dict
    data_read: dict
    tokenizer: dict | None  # whose ids the model reads (data.shards.corpus_tokenizer): what evaluates it checks
    wandb_run_id: str | None
    keep: int
    lock: RunDirectoryLock
    ctx: DistributedContext

    def save(self, progress: Progress, skipped_steps: int, stopping: bool = False) -> None:
        """Write the checkpoint of ``progress.step``, keep the newest ``keep`` and record its path in ``progress``
        (rank 0's; None on the other ranks); ``stopping``: on a termination signal, which the log then tells.

        Every rank raises alike when rank 0 could not write it (:class:`CheckpointSaveError`, saying how much work is
        lost) or found a NaN/inf in the state (:class:`TrainingDiverged`: such a checkpoint would be resumed from).
        """
        step, ctx = progress.step, self.ctx
        rng_states = all_gather_objects(rng_state(), ctx)
        # data.draws=authors: each rank's generators and the windows drawn ahead, for a resume to draw on alike
        draw_states = all_gather_objects(self.draws.state_dict(step), ctx) if self.draws else None
        optimizer_state = full_state_dict(self.optimizer)
        eval_model = evaluation_state_dict(self.model, self.optimizer)  # an averaging optimizer's, for evaluation
        path, failure, diverged = None, None, None
        if ctx.is_main:
            state = {"model": self.model.state_dict(), "optimizer": optimizer_state, "step": step,
                     "tokens": progress.tokens, "rng": rng_states, "config": self.config, "data": self.data_read,
                     "tokenizer": self.tokenizer, "wandb_run_id": self.wandb_run_id, "skipped_steps": skipped_steps}
            if draw_states:
                state["authors_draws"] = draw_states
            if eval_model is not None:
                state["eval_model"] = eval_model
            non_finite = non_finite_entries(state["model"], optimizer_state)
            if non_finite:
                diverged = non_finite_state_reason(non_finite)
            else:
                try:
                    self.lock.hold_on()
                    path = save_checkpoint(self.run_dir, step, state, keep=self.keep)
                except CheckpointSaveError as err:
                    failure = lost_work_message(err, step, progress.checkpoint)
                except RunDirectoryError as err:
                    failure = f"the checkpoint of step {step} was not written: {err}"
        # A gather, not a barrier: nobody moves on (or exits) before the checkpoint is on disk, and a failed or
        # refused save stops every rank.
        outcomes = all_gather_objects((failure, diverged), ctx)
        if any(diverged for _, diverged in outcomes):
            raise TrainingDiverged(next(diverged for _, diverged in outcomes if diverged), step, progress.checkpoint,
                                   f"{NOT_CHECKPOINTED} {divergence_advice(self.run_dir)}")
        failures = [failure for failure, _ in outcomes if failure]
        if failures:
            raise CheckpointSaveError(failures[0])
        progress.checkpoint = path
        if stopping:
            log.warning("stopping after step %d on a termination signal; %s holds the run's state", step,
                        path or "the checkpoint")


def lost_work_message(err: CheckpointSaveError, step: int, previous: Path | None) -> str:
    """What failed, what is kept and how many steps a resume repeats."""
    if previous is None:
        kept = f"no earlier checkpoint exists: all {step} steps are lost"
    else:
        kept = (f"the previous checkpoint {previous} is intact: {step - checkpoint_step(previous)} steps are lost "
                "and a resume repeats them")
    return f"{err} (step {step}); {kept}. Free space or fix the directory, then resume: {resume_command()}"
