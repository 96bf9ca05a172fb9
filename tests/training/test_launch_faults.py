"""Faults that a restart cannot fix, on two torchrun "nodes" on this machine (Gloo on the CPU, one c10d rendezvous,
``--max-restarts=3`` as docs/multi-node.md launches them): a whole frozen node (the first one too), a refused launch,
and the line a collective's timeout ends in."""
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests import warm_python
from tests.source_copy import copy_source_tree
from tests.training.test_elastic import (REPO, SMALL, logs, process_tree, running, signal_process_groups,
                                         start_node, stop_all, torchrun_node, wait_for, workers)

TIMEOUT_S = 10  # train.distributed_timeout_s of these runs
WAIT_S = 120


@contextlib.contextmanager
def two_nodes(tmp_path: Path, *overrides: str, repos=(REPO, REPO), max_restarts: int = 3,
              through_reason_last: bool = False, run_id: str | None = "job", cwd: Path | None = None):
    """Both nodes of a job (node i runs ``repos[i]``'s train.py; run id None: torchrun's default), node 0 first:
    its torchrun holds the rendezvous's store, as the first node's does on a cluster. ``through_reason_last``: each
    torchrun runs under the launch scripts' ``reason_last``, as scripts/slurm_multinode.sbatch runs it."""
    port, run_id, nodes = warm_python.free_port(), run_id and f"{run_id}-{uuid.uuid4().hex[:8]}", []
    try:
        for index, repo in enumerate(repos):
            command = torchrun_node(f"127.0.0.1:{port}", run_id, str(repo / "train.py"), *SMALL, *overrides,
                                    max_restarts=max_restarts)
            if through_reason_last:
                command = ["bash", "-c", 'source "$0" && reason_last "$@"', str(REPO / "scripts/reason_last.sh"),
                           *command]
            nodes.append(start_node(command, repo, tmp_path / f"node{index}.log", cwd))
            if index == 0:
                wait_for(lambda: listening(port), WAIT_S, "node 0's rendezvous store")
        yield nodes
    finally:
        stop_all(nodes)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def freeze_node_1_after_a_checkpoint(nodes, run_dir: Path, whole_node: bool) -> float:
    """SIGSTOP node 1's worker (and its torchrun, with ``whole_node``) once the step-2 checkpoint exists; returns
    how long node 0 then took to end."""
    wait_for(lambda: workers(nodes[1]) and (run_dir / "checkpoints" / "ckpt_00000002.pt").exists(), WAIT_S,
             "node 1's worker after the step-2 checkpoint")
    os.kill(workers(nodes[1])[0], signal.SIGSTOP)
    if whole_node:
        os.kill(nodes[1].pid, signal.SIGSTOP)
    frozen = time.monotonic()
    nodes[0].wait(timeout=WAIT_S)
    return time.monotonic() - frozen


@pytest.mark.slow
def test_a_whole_frozen_node_ends_the_job_within_the_distributed_timeout_despite_max_restarts(tmp_path):
    # Node 1's torchrun and its worker freeze: node 0's worker gives up after train.distributed_timeout_s, and its
    # torchrun ends instead of restarting it to wait for node 1 to join again (the rendezvous's join timeout,
    # 600 s by default, and once more per restart).
    run_dir = tmp_path / "frozen"
    with two_nodes(tmp_path, f"hydra.run.dir={run_dir}", "train.max_iters=1000", "train.checkpoint_interval=2",
                   f"train.distributed_timeout_s={TIMEOUT_S}") as nodes:
        waited = freeze_node_1_after_a_checkpoint(nodes, run_dir, whole_node=True)
    assert nodes[0].returncode != 0, logs(tmp_path)
    assert TIMEOUT_S <= waited < 2 * TIMEOUT_S + 15, logs(tmp_path)


@pytest.mark.slow
def test_a_frozen_first_node_ends_the_other_within_the_distributed_timeout_and_a_minute_telling_why_once_and_last(
        tmp_path):
    # Node 0's torchrun holds the rendezvous's store; it and its worker freeze (SIGSTOP of their process groups, as
    # a hung NFS mount or driver leaves them). Node 1's worker gives up after train.distributed_timeout_s, and its
    # torchrun, which polls node 0's store, would wait on it for good (for ever as far as seen, its worker a zombie).
    run_dir = tmp_path / "frozen"
    with two_nodes(tmp_path, f"hydra.run.dir={run_dir}", "train.max_iters=1000", "train.checkpoint_interval=2",
                   f"train.distributed_timeout_s={TIMEOUT_S}", through_reason_last=True) as nodes:
        wait_for(lambda: (run_dir / "checkpoints" / "ckpt_00000002.pt").exists(), WAIT_S, "the step-2 checkpoint")
        node_1 = process_tree(nodes[1].pid)  # its launch script, torchrun and worker
        signal_process_groups(nodes[0], signal.SIGSTOP)
        try:
            status = nodes[1].wait(timeout=TIMEOUT_S + 60)
        except subprocess.TimeoutExpired:
            status = None
        left_running = [pid for pid in node_1 if running(pid)]  # before node 0 goes: nothing more to print
    assert status not in (None, 0), logs(tmp_path)
    assert not left_running, logs(tmp_path)
    reason = told_once_and_last((tmp_path / "node1.log").read_text().splitlines(), "error: rank ")
    assert "stopped answering" in reason[0] and f"train.distributed_timeout_s={TIMEOUT_S} " in reason[0], reason


@pytest.mark.slow
def test_a_collective_timeout_ends_in_one_line_naming_the_setting_its_value_and_the_silent_rank(tmp_path):
    run_dir = tmp_path / "frozen"
    with two_nodes(tmp_path, f"hydra.run.dir={run_dir}", "train.max_iters=1000", "train.checkpoint_interval=2",
                   "train.distributed_timeout_s=5", max_restarts=0) as nodes:
        freeze_node_1_after_a_checkpoint(nodes, run_dir, whole_node=False)
    assert nodes[0].returncode != 0, logs(tmp_path)
    node_0 = (tmp_path / "node0.log").read_text()
    [line] = [line for line in node_0.splitlines() if line.startswith("error: ")]
    rank, other = (0, 1) if "[train][INFO]" in node_0 else (1, 0)  # rank 0 alone logs the training
    assert line.startswith(f"error: rank {other} stopped answering: rank {rank} waited "
                           "train.distributed_timeout_s=5 seconds"), node_0
    assert f"traceback : {line}" in node_0  # torchrun's summary (without restarts) names it as the root cause
    assert "Error executing job" not in node_0 and "Timed out waiting" not in node_0, node_0


def changed_copy(tmp_path: Path, edited: str) -> Path:
    """A copy of the repository without .git in which one line of ``edited`` differs."""
    copy = tmp_path / "copy"
    copy_source_tree(copy)
    (copy / edited).write_text((copy / edited).read_text() + "# edited on this node only\n")
    return copy


def refused_on_both_nodes_at_once(tmp_path: Path, *overrides: str, **launch) -> list[list[str]]:
    """Run a job that every rank refuses under ``--max-restarts=3``, each torchrun under reason_last (which prints
    the reason again after torchrun's own output); returns each node's output, once both ended within seconds."""
    started = time.monotonic()
    with two_nodes(tmp_path, "train.max_iters=2", *overrides, through_reason_last=True, **launch) as nodes:
        for node in nodes:
            node.wait(timeout=WAIT_S)
    assert time.monotonic() - started < 60, logs(tmp_path)
    assert [node.returncode != 0 for node in nodes] == [True, True], logs(tmp_path)
    return [(tmp_path / f"node{index}.log").read_text().splitlines() for index in (0, 1)]


def told_once_and_last(output: list[str], reason_start: str) -> list[str]:
    """The reason (its lines) that ``output`` ends with, after asserting that the node's rank told it once before."""
    told = [at for at, line in enumerate(output) if line.startswith(reason_start)]
    assert len(told) == 2, output  # told by the node's first rank, then again last
    reason = output[told[1]:]  # to the end: the message's lines
    assert output[told[0]:told[0] + len(reason)] == reason, output
    return reason


@pytest.mark.slow
def test_a_node_running_other_code_under_max_restarts_ends_every_node_at_once_each_telling_it_once_and_last(
        tmp_path):
    outputs = refused_on_both_nodes_at_once(tmp_path, f"hydra.run.dir={tmp_path / 'run'}",
                                            repos=(REPO, changed_copy(tmp_path, "mars/torch_backend.py")))
    for output in outputs:
        reason = told_once_and_last(output, "error: the ranks of this job run different code: rank 1")
        assert "holds other source files than rank 0" in reason[0] and "mars/torch_backend.py" in reason[0]


@pytest.mark.slow
def test_a_launch_without_a_run_id_under_max_restarts_ends_every_node_at_once_each_telling_it_once_and_last(
        tmp_path):
    # Started from tmp_path, so that outputs/ lands there.
    for output in refused_on_both_nodes_at_once(tmp_path, run_id=None, cwd=tmp_path):
        told_once_and_last(output, "error: under torchrun without --rdzv-id the ranks cannot agree")
