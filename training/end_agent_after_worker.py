"""``python end_agent_after_worker.py AGENT BOUND_S``, started by a torchrun worker whose agent waits on a rendezvous
store that does not answer (:func:`training.elastic.end_torchrun_agent_after_exit`): SIGKILL the agent once all its
workers have exited.

Not before: the agent's end lets its launch script print the worker's reason as the node's last line, and a worker
still exiting (its own line, wandb's closing lines, its interpreter's shutdown) would print after it. Workers still
running after ``BOUND_S`` seconds are hung as they exit, and are SIGKILLed first. An agent that reads the exit status
of any of its workers is not waiting on the store after all, and is left alone. Standard library only, so that it
starts at once.
"""
import os
import signal
import sys
import time

POLL_S = 0.1


def main(agent: int, bound_s: float) -> None:
    agent_command = command_line(agent)
    workers = children(agent)
    deadline = time.monotonic() + bound_s
    while any(state(pid) not in ("Z", None) for pid in workers) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if agent_command is None or any(state(pid) is None for pid in workers):
        return  # the agent is gone, or went on: it read a worker's exit status
    for pid in workers:
        kill(pid)  # a zombie ignores it
    if command_line(agent) == agent_command:  # not a process that took its id after it ended
        kill(agent)


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as listed:
            return [int(child) for child in listed.read().split()]
    except FileNotFoundError:
        return []


def state(pid: int) -> str | None:
    """The process's state (``Z``: it has exited, and its parent has not read its exit status), None once gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read()
    except FileNotFoundError:
        return None
    return fields[fields.rindex(")") + 2]  # after the command's name, in parentheses (which may hold anything)


def command_line(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except FileNotFoundError:
        return None


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
