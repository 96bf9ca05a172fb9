"""Preemption: SIGTERM (what clusters and torchrun send before killing a job) or a first Ctrl-C ends the run
cleanly.

The handler only records the signal; the training loop checks it between steps, writes a checkpoint and stops,
so that no more than the current step is lost. A second Ctrl-C stops at once (the steps since the last
checkpoint are lost). The record is kept for the whole process: in a local sweep (``-m``), whose points run one
after another in one process, a signal that stopped one point also keeps the next ones from starting.
"""
import logging
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
        raise KeyboardInterrupt
    if _received is None:
        _received = name
    hint = " (Ctrl-C again to stop at once)" if signum == signal.SIGINT else ""
    log.warning("received %s: finishing this step, then checkpointing and stopping%s", name, hint)


class PreemptionSignal:
    """Catches SIGTERM and SIGINT while a run trains (a context manager: the previous handlers come back after)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __enter__(self) -> "PreemptionSignal":
        self._previous = {signum: signal.signal(signum, _handle) for signum in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    @property
    def received(self) -> bool:
        """Whether this process got the signal; the ranks agree on it in each step's all-reduce
        (``train.read_step_scalars``), and all checkpoint and stop together."""
        return _received is not None


def refuse_if_terminated(run_dir, resume_command: str) -> None:
    """Raise :class:`TerminatedEarlier` when a termination signal reached this process before this run began;
    the message gives ``resume_command``, which finishes the sweep in its own directory."""
    if _received is not None:
        raise TerminatedEarlier(
            f"not starting {run_dir}: this process received {_received} during an earlier run of its sweep, "
            f"which stopped at a checkpoint. Finish every point (finished ones are skipped) with: {resume_command}"
        )
