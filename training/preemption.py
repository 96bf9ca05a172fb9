"""Preemption: SIGTERM (what clusters and torchrun send before killing a job) ends the run cleanly.

The handler only records the signal; the training loop checks it between steps, writes a checkpoint and stops,
so that no more than the current step is lost.
"""
import logging
import signal

log = logging.getLogger(__name__)


class PreemptionSignal:
    def __init__(self, signals=(signal.SIGTERM,)):
        self._received = False
        for signum in signals:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        log.warning("received %s: finishing this step, then checkpointing and stopping", signal.Signals(signum).name)
        self._received = True

    @property
    def received(self) -> bool:
        """Whether this process got the signal; the ranks agree on it in each step's all-reduce
        (``train.read_step_scalars``), and all checkpoint and stop together."""
        return self._received
