"""training/end_agent_after_worker.py against a stand-in agent: a process that starts workers and then reads their
exit status (torchrun going on) or never does (torchrun waiting on a frozen store)."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.test_elastic import children, running, wait_for

REPO = Path(__file__).resolve().parents[2]
# The agent: starts a worker per argument (it runs that many seconds), reads their exit status or not, then waits.
AGENT = """
import subprocess, sys, time
reads_status, *lifetimes = sys.argv[1:]
workers = [subprocess.Popen(["sleep", lifetime]) for lifetime in lifetimes]
if reads_status == "yes":
    for worker in workers:
        worker.wait()
time.sleep(60)
"""


def run_ender(*lifetimes: str, reads_status: bool = False, bound_s: float = 10) -> tuple[int | None, list[int]]:
    """Start the stand-in agent with workers living ``lifetimes`` seconds, and the ender on it; once the ender has
    ended, the agent's exit status (None: still running) and its workers."""
    agent = subprocess.Popen([sys.executable, "-c", AGENT, "yes" if reads_status else "no", *lifetimes])
    try:
        wait_for(lambda: len(children(agent.pid)) == len(lifetimes), 10, "the agent's workers")
        workers = children(agent.pid)
        subprocess.run([sys.executable, "-I", str(REPO / "training/end_agent_after_worker.py"), str(agent.pid),
                        str(bound_s)], check=True, timeout=30)
        try:
            return agent.wait(timeout=1), workers
        except subprocess.TimeoutExpired:
            return None, workers
    finally:
        agent.kill()
        agent.wait()


def test_the_agent_is_killed_once_every_worker_has_exited_unread():
    started = time.monotonic()
    status, _ = run_ender("0.2", "1")
    assert status == -signal.SIGKILL
    assert 1 <= time.monotonic() - started < 5  # after its last worker, well before the bound


def test_a_worker_still_running_after_the_bound_is_killed_and_then_the_agent():
    started = time.monotonic()
    status, [worker] = run_ender("60", bound_s=0.5)
    assert status == -signal.SIGKILL
    assert not running(worker)
    assert time.monotonic() - started < 5


@pytest.mark.slow
def test_an_agent_that_reads_its_workers_exit_status_is_left_alone():
    status, _ = run_ender("2", reads_status=True)
    assert status is None
