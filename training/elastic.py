"""What a worker can learn of the torchrun agent that started it (its command line), and ending the job for good.

torchrun restarts a failed worker group while ``--max-restarts`` remain, whatever the exit status: it has no status
for "a restart cannot fix this". What every node's agent does read before a restart is the c10d rendezvous, and a
closed one ends it (``RendezvousClosedError``) instead of restarting: so a worker that meets such a fault closes it.
Where the rendezvous's store does not answer (the first node, which holds it, frozen), the agent waits on that store
for good, and the worker has it ended once its workers have exited (:func:`end_torchrun_agent_after_exit`).
"""
import logging
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import RendezvousError
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, RendezvousTimeout
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
from torch.distributed.run import get_args_parser, parse_min_max_nnodes

log = logging.getLogger(__name__)
# How long closing may take: the rendezvous's store is on the first node, which may be the one that is gone.
CLOSE_TIMEOUT_S = 10.0
C10D_DEFAULT_PORT = 29400  # torchrun's, for an endpoint without a port
# How long the workers of an agent that is to be ended may take to exit (their own line, their interpreter's shutdown,
# wandb's closing upload): one still there after this is hung as it exits, and is ended too.
WORKER_EXIT_BOUND_S = 30.0


def torchrun_command() -> list[str] | None:
    """torchrun's command line when this process is one of its workers (the worker's parent, read from /proc:
    torchrun tells its workers nothing of its arguments); None where there is none."""
    agent = Path(f"/proc/{os.getppid()}/cmdline")
    if "TORCHELASTIC_RUN_ID" not in os.environ or not agent.is_file():
        return None
    return [os.fsdecode(arg) for arg in agent.read_bytes().split(b"\0") if arg]


def close_rendezvous() -> bool:
    """Close this job's c10d rendezvous, so that no node's agent restarts its workers: each ends as soon as its
    own fail. Nothing to close outside torchrun, under ``--standalone`` (its endpoint is known to the agent only)
    or another rendezvous backend: there torchrun restarts as before. A rendezvous that is not closed within
    ``CLOSE_TIMEOUT_S`` is left as it is, with a warning (a frozen node holding its store answers nothing, and
    torch's store client waits for it for good, whatever its timeout: the closing runs in a thread of its own, left
    behind).

    Returns whether the rendezvous's store answered (False: it did not within ``CLOSE_TIMEOUT_S``, and this node's
    agent, which polls the same store, is waiting on it for good: :func:`end_torchrun_agent_after_exit`)."""
    agent_args = torchrun_arguments()
    if agent_args is None or agent_args.standalone or agent_args.rdzv_backend != "c10d":
        return True
    host, port = parse_rendezvous_endpoint(agent_args.rdzv_endpoint, C10D_DEFAULT_PORT)
    problems = []
    closing = threading.Thread(target=close_c10d_rendezvous, daemon=True,
                               args=(host, port, agent_args.nnodes, problems))
    closing.start()
    closing.join(CLOSE_TIMEOUT_S)
    if closing.is_alive():
        log.warning("torchrun's rendezvous at %s:%d did not answer within %gs (the node holding it is frozen?): this "
                    "node's torchrun, which would wait on it for good, is ended once its workers have exited",
                    host, port, CLOSE_TIMEOUT_S)
        return False
    if problems:
        log.warning("could not close torchrun's rendezvous at %s:%d (%s): torchrun may restart the workers",
                    host, port, problems[0])
    return True


def end_torchrun_agent_after_exit() -> None:
    """Have the torchrun agent that started this worker (its parent) SIGKILLed once its workers, this one among them,
    have exited, by a process of its own (training/end_agent_after_worker.py); nothing outside torchrun.

    For an agent whose rendezvous's store does not answer: its main thread then waits in torch's store client, in a
    receive without a timeout, where Python runs no signal handler, so the SIGTERM that torchrun handles (stopping
    its workers, then exiting) would stay pending for good."""
    agent = os.getppid()
    # Its command line is read from /proc/<parent>: a parent that is the same process after the reading is torchrun.
    if torchrun_arguments() is None or os.getppid() != agent:
        return
    subprocess.Popen([sys.executable, "-I", str(Path(__file__).with_name("end_agent_after_worker.py")), str(agent),
                      f"{WORKER_EXIT_BOUND_S:g}"], stdin=subprocess.DEVNULL)


def close_c10d_rendezvous(host: str, port: int, nnodes: str, problems: list[str]) -> None:
    """Mark the rendezvous of this job at ``host``:``port`` closed; a failure is added to ``problems``."""
    run_id = os.environ["TORCHELASTIC_RUN_ID"]
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=CLOSE_TIMEOUT_S))
        handler = DynamicRendezvousHandler.from_backend(
            run_id, store, C10dRendezvousBackend(store, run_id), *parse_min_max_nnodes(nnodes),
            timeout=RendezvousTimeout(close=timedelta(seconds=CLOSE_TIMEOUT_S)))
        handler.set_closed()
    except (RendezvousError, RuntimeError, TimeoutError, ValueError) as err:
        problems.append(" ".join(str(err).split())[:200])


def torchrun_arguments():
    """torchrun's own arguments (an argparse namespace, read with its own parser), or None outside torchrun."""
    command = torchrun_command()
    if command is None:
        return None
    # Its arguments start with its first option: after `python -m torch.distributed.run` or `python .../torchrun`.
    first_option = next((index for index, arg in enumerate(command) if arg.startswith("--")), len(command))
    try:
        return get_args_parser().parse_known_args(command[first_option:])[0]
    except SystemExit:  # argparse's way of refusing: not a command line torchrun took
        return None
