"""Preemption: SIGTERM (what clusters and torchrun send before killing a job), submitit's timeout or preemption
signal (SIGUSR2, or $SUBMITIT_PREEMPT_SIGNAL) or a first Ctrl-C ends the run cleanly.

The handler only records the signal; the training loop checks it between steps, writes a checkpoint and stops,
so that no more than the current step is lost. A second Ctrl-C stops at once (the steps since the last
checkpoint are lost). After submitit's signal, submitit's own handler runs once the checkpoint is written: on rank
0 it requeues the job, which resumes from that checkpoint. The record is kept for the whole process: in a local
sweep (``-m``), whose points run one after another in one process, a signal that stopped one point also keeps the
next ones from starting.
"""
import logging
import os
import signal

log = logging.getLogger(__name__)

# The name of the first signal this process got, whichever run was going then.
_received: str | None = None


class TerminatedEarlier(RuntimeError):
    """A termination signal reached this process during an earlier run: no further run may start."""


def _handle(signum, frame) -> None:
    global _received
    name = signal.Signals(signum).name
    if signum == signal.SIGINT and _received == name:
        # Stops wherever the run is (a save in progress removes its partial file), with one line, no traceback.
        raise SystemExit("error: stopped at once by a second Ctrl-C: the steps since the run's last checkpoint are "
                         "lost (its checkpoints are intact); continue it with train.resume=true")
    if _received is None:
        _received = name
    hint = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
    log.warning("received %s: finishing this step, then checkpointing and stopping%s", name, hint)


def submitit_signal() -> signal.Signals:
    """The signal submitit sends on a timeout or preemption (and then requeues on): its own setting's."""
    return signal.Signals[f"SIG{os.environ.get('SUBMITIT_PREEMPT_SIGNAL', 'USR2')}"]


class PreemptionSignal:
    """Catches SIGTERM, SIGINT and submitit's signal while a run trains (a context manager: the previous handlers
    come back after, and submitit's is then called if its signal came)."""

    def __enter__(self) -> "PreemptionSignal":
        signals = dict.fromkeys((signal.SIGTERM, signal.SIGINT, submitit_signal()))  # submitit's may be SIGTERM
        self._previous = {signum: signal.signal(signum, _handle) for signum in signals}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        submitit = submitit_signal()
        if _received == submitit.name and callable(self._previous[submitit]):
            self._previous[submitit](submitit, None)  # submitit's requeue, now that the checkpoint is written

    @property
    def received(self) -> bool:
        """Whether this process got the signal; the ranks agree on it in each step's all-reduce
        (``train.read_step_scalars``), and all checkpoint and stop together."""
        return _received is not None


def received_signal() -> str | None:
    """The name of the first termination signal this process got, None before any."""
    return _received


def refuse_if_terminated(run_dir, resume_command: str) -> None:
    """Raise :class:`TerminatedEarlier` when a termination signal reached this process before this run began;
    the message gives ``resume_command``, which finishes the sweep in its own directory."""
    if _received is not None:
        raise TerminatedEarlier(
            f"not starting {run_dir}: this process received {_received} during an earlier run of its sweep, "
            f"which stopped at a checkpoint. Finish every point (finished ones are skipped) with: {resume_command}"
        )
