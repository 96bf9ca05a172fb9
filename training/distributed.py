"""Process-group setup for torchrun (NCCL on GPU, Gloo on CPU); a single process needs none of it."""
import contextlib
import gc
import json
import logging
import os
import re
import time
import traceback
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
# Before any group exists: torch.distributed.nn.functional binds ``group.WORLD`` as the default argument of its
# collectives when first imported, and torch._dynamo imports it, which DDP's constructor and an optimizer's
# first step import; imported after init_process_group, it would hold the default group for good (see
# shutdown_distributed).
import torch.distributed.nn  # noqa: F401
from torch.nn.parallel import DistributedDataParallel

from training.elastic import close_rendezvous, end_torchrun_agent_after_exit

log = logging.getLogger(__name__)
# How long a rank waits for the others: to join the group, then in every collective. A frozen or lost node ends the
# job after this long (torch's own default is 30 minutes); it must outlast rank 0 writing a checkpoint.
DEFAULT_TIMEOUT_S = 600.0
STORE_POLL_S = 0.05
# How long a rank that leaves the telling to its node's first rank waits before exiting, so that the first rank's
# line is out first. Under torchrun the agent stops it as soon as that rank has failed: the bound covers a first rank
# slow to close the rendezvous (up to training.elastic.CLOSE_TIMEOUT_S). Ranks started without an agent (each by
# SLURM's srun) wait out the whole delay and the first rank has only its line to write: a shorter wait ends the job
# sooner.
QUIET_RANK_EXIT_DELAY_S = 30.0
QUIET_RANK_EXIT_DELAY_WITHOUT_AGENT_S = 5.0
# Set by scripts/reason_last.sh: the file that receives the reason a run stopped for, which the script prints last.
REASON_VARIABLE = "TRAIN_REASON_FILE"


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def under_torchrun_agent() -> bool:
    """Whether torchrun's agent started this process (it watches the workers; srun-started ranks have none)."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def stop_with_message(message: str, every_rank_meets_it: bool, restartable: bool = False) -> NoReturn:
    """Exit with ``message`` as the process's last line and a non-zero status.

    A fault that every rank meets alike (a refused config) is told once: by rank 0, or under torchrun by the first
    rank of each node (each node's torchrun has an output of its own), which also hands it to torchrun as the
    failure's root cause (shown in torchrun's summary instead of a pointer to its docs); the other ranks wait
    quietly until torchrun stops them once that rank has failed (or exit after ``QUIET_RANK_EXIT_DELAY_S``; without
    an agent, after ``QUIET_RANK_EXIT_DELAY_WITHOUT_AGENT_S``), so that its line is out first. A fault of one rank
    is told by that rank. Unless ``restartable``, the fault ends the job on every node, whatever torchrun's
    ``--max-restarts``: a restart would meet it again (:func:`training.elastic.close_rendezvous`); where the
    rendezvous's store does not answer (the first node frozen), this node's torchrun, which would wait on it for
    good, is ended once its ranks have exited (:func:`training.elastic.end_torchrun_agent_after_exit`). The launch
    script prints the message last (scripts/reason_last.sh).
    """
    if every_rank_meets_it and not tells_faults_of_every_rank():
        time.sleep(QUIET_RANK_EXIT_DELAY_S if under_torchrun_agent() else QUIET_RANK_EXIT_DELAY_WITHOUT_AGENT_S)
        raise SystemExit(1)
    if launched_by_torchrun():
        write_for_launchers(message, restartable)
        if not restartable and not close_rendezvous():
            end_torchrun_agent_after_exit()  # it waits on the rendezvous's frozen store for good
    raise SystemExit(message)


def tells_faults_of_every_rank() -> bool:
    """Whether this rank is the one to tell a fault that every rank meets: under torchrun's agent the first rank of
    its node, else rank 0."""
    if under_torchrun_agent():
        return int(os.environ.get("LOCAL_RANK", "0")) == 0
    return not launched_by_torchrun() or int(os.environ["RANK"]) == 0


def write_for_launchers(message: str, restartable: bool) -> None:
    """Give ``message`` to torchrun, whose summary names it as the root cause, and, where it ends the job, to a
    launch script that asked for it (``REASON_VARIABLE``): torchrun's own record of a job it ended on a closed
    rendezvous holds only its own error."""
    # torchrun's record format; py_callstack is what its summary shows
    record = json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": message,
                                                                       "timestamp": str(int(time.time()))}}})
    files = {"TORCHELASTIC_ERROR_FILE": record, **({} if restartable else {REASON_VARIABLE: f"{message}\n"})}
    for variable, text in files.items():
        if os.environ.get(variable):
            with contextlib.suppress(OSError):  # the message on stderr is what matters
                Path(os.environ[variable]).write_text(text)


def init_distributed(device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistributedContext:
    """Join the torchrun process group if there is one; on CUDA each process takes the GPU of its local rank.

    A rank that waits longer than ``timeout_s`` seconds for the others, to join or in any collective later,
    raises (Gloo: :class:`DistributedTimeout`, turned into one by :func:`distributed_session` in a collective;
    NCCL's watchdog aborts the process): the rank exits non-zero, and torchrun ends the job (on c10d nodes
    whatever its ``--max-restarts``: a restart would wait for the same node again).
    """
    if not launched_by_torchrun():
        return DistributedContext(device=device)
    check_launcher_variables()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            log.info("joining a process group of %d ranks at %s:%s (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                     "from the environment); waiting up to %gs (train.distributed_timeout_s) for the others",
                     world_size, os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], timeout_s)
        try:
            dist.init_process_group(backend=backend, store=elastic_store(rank, world_size, timeout), rank=rank,
                                    world_size=world_size, timeout=timeout)
        except (dist.DistError, TimeoutError) as err:
            # Without torchrun's agent, the variables may be what an earlier launcher left in the shell.
            leftover = "" if under_torchrun_agent() else (
                f", or these variables are left over from an earlier launcher in this shell: `unset "
                f"{' '.join(LAUNCHER_VARIABLES)}` to train in one process")
            raise GroupJoinTimeout(
                f"rank {rank} of WORLD_SIZE={world_size} could not join the process group at "
                f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within {timeout_s:g}s "
                f"({' '.join(str(err).split())[:200]}): a node is down or still starting{leftover}") from None
    return DistributedContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


class DistributedTimeout(ValueError):
    """A rank waited ``train.distributed_timeout_s`` for others: a restart would wait for them again."""


class GroupJoinTimeout(DistributedTimeout):
    """The other ranks did not join the process group in time; the message names the address and the fixes."""


# Gloo's error when a collective's peer sends nothing within the group's timeout (NCCL's watchdog aborts instead).
GLOO_TIMEOUT = re.compile(r"Timed out waiting \d+ms for (recv|send) operation")


def collective_timeout(ctx: DistributedContext, timeout_s: float) -> DistributedTimeout:
    """The one-line error of a collective that timed out on this rank: which setting, its value, and the rank that
    stopped answering where the group tells (with two ranks, the other)."""
    silent = f"rank {1 - ctx.rank}" if ctx.world_size == 2 else "another rank"
    return DistributedTimeout(
        f"{silent} stopped answering: rank {ctx.rank} waited train.distributed_timeout_s={timeout_s:g} seconds for "
        "it in a collective (its node is down, frozen or slower than that: raise train.distributed_timeout_s if a "
        "step or a checkpoint write takes that long)")


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def check_launcher_variables() -> None:
    """torchrun sets all of ``LAUNCHER_VARIABLES``; some of them alone are what an earlier launcher left in the
    shell (an ``export RANK=0``), and would make a plain run wait for ranks that never come, or fail obscurely."""
    missing = [name for name in LAUNCHER_VARIABLES if name not in os.environ]
    malformed = [name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
                 if not os.environ.get(name, "0").isdigit()]
    if missing or malformed:
        present = " ".join(f"{name}={os.environ[name]}" for name in LAUNCHER_VARIABLES if name in os.environ)
        problem = f"{', '.join(missing)} unset" if missing else f"{', '.join(malformed)} not a number"
        raise ValueError(f"the environment holds {present} but {problem}: left over from an earlier launcher? "
                         f"`unset {' '.join(LAUNCHER_VARIABLES)}` to train in one process, or launch with torchrun")


def elastic_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store | None:
    """Under torchrun's agent store, a client of it whose keys are private to this worker group (this start or
    restart of the job's workers on every node). None (torch's own env:// rendezvous) otherwise.

    The agent store outlives restarts and holds the keys of every earlier group: torch's env:// rendezvous would
    hand a restarted Gloo group the dead group's addresses ("connectFullMesh failed ... Connection refused").
    Nor can a per-restart prefix come from ``TORCHELASTIC_RESTART_COUNT``: under c10d only the node whose worker
    failed counts a restart, the others restart as a membership change and keep their count. So rank 0 draws a
    fresh prefix and hands it to each rank (:func:`share_group_prefix`).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    return dist.PrefixStore(share_group_prefix(store, rank, world_size, timeout), store)


def share_group_prefix(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> str:
    """A key prefix that every rank of this group gets from rank 0, and no earlier group used.

    Every key an earlier group left may be stale, so none is trusted: rank k asks under a number of its own
    (``asks/k``, a counter only ever increased, so the number is new) and waits for the answer filed under that
    number; rank 0 answers each rank's latest ask until every rank has confirmed, under the new prefix, that it
    read it. An ask of a dead worker only ever gets an answer nobody reads.
    """
    if rank != 0:
        ask = store.add(f"elastic/asks/{rank}", 1)
        try:
            prefix = store.get(f"elastic/answers/{rank}/{ask}").decode()  # waits up to the store's timeout
        except dist.DistStoreError as err:
            raise TimeoutError(f"rank {rank} heard nothing from rank 0 within {timeout} "
                               "(train.distributed_timeout_s): a node is down, frozen or still starting") from err
        store.set(f"{prefix}confirmed/{rank}", "1")
        return prefix
    prefix = f"elastic/group_{uuid.uuid4().hex}/"
    waiting = set(range(1, world_size))
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        for other in sorted(waiting):
            store.set(f"elastic/answers/{other}/{store.add(f'elastic/asks/{other}', 0)}", prefix)
            if store.check([f"{prefix}confirmed/{other}"]):
                waiting.discard(other)
        if not waiting:
            return prefix
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks {sorted(waiting)} did not join the process group within {timeout} "
                               "(train.distributed_timeout_s): a node is down, frozen or still starting")
        time.sleep(STORE_POLL_S)


def wrap_data_parallel(model: torch.nn.Module, ctx: DistributedContext) -> torch.nn.Module:
    if not ctx.enabled:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def sums_across_ranks(values: list[float], ctx: DistributedContext) -> list[float]:
    """Each of ``values`` summed over the ranks, in one all-reduce (float64)."""
    if not ctx.enabled:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def all_gather_objects(obj, ctx: DistributedContext) -> list:
    """Every rank's ``obj``, in rank order (a list of one without a process group)."""
    if not ctx.enabled:
        return [obj]
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(ctx: DistributedContext) -> None:
    if ctx.enabled:
        dist.barrier()


@contextlib.contextmanager
def distributed_session(device: torch.device, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[DistributedContext]:
    """:func:`init_distributed`, then :func:`shutdown_distributed` however the block ends.

    An exception's traceback keeps the frames it passed through, and their locals (the DDP module, the
    optimizer) would keep the process group alive past the shutdown: those locals are cleared first (the
    traceback still names every line).
    """
    ctx = init_distributed(device, timeout_s)
    try:
        yield ctx
    except BaseException as err:
        traceback.clear_frames(err.__traceback__)
        if isinstance(err, RuntimeError) and GLOO_TIMEOUT.search(str(err)):
            raise collective_timeout(ctx, timeout_s) from None
        raise
    finally:
        shutdown_distributed()


def shutdown_distributed() -> None:
    """Destroy the process group, its Gloo worker threads joined, while the interpreter still runs.

    ``destroy_process_group()`` only drops torch's registry of groups, and a Gloo group has no shutdown of its
    own: its worker threads stop when its last reference goes. A worker can still be releasing a finished
    collective's tensors, which takes the GIL. So the last reference must be the registry's, dropped here: a
    Python handle of the group lets go of the GIL while its destructor joins the threads. Dropped later, by a
    DDP module (its reducer keeps the GIL while it joins: both wait for ever) or at interpreter finalization
    (the worker's GIL request ends its thread mid-destructor: "terminate called without an active exception",
    SIGABRT), the process hangs or aborts at random.
    Hence the DDP module and the optimizers must be gone before this is called (MARS and Muon hold their group
    weakly), as :func:`distributed_session` sees to on an error path too.
    """
    if not dist.is_initialized():
        return
    gc.collect()  # a DDP module in a reference cycle (a module and its hooks) goes now, before the group
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    if group() is not None:
        log.warning("the process group is still referenced after destroy_process_group(): its Gloo threads then "
                    "outlive it, and the process may hang or abort (SIGABRT) as it exits; drop the DDP module "
                    "and the optimizers (and the traceback frames holding them) before shutting down")
