"""Two torchrun "nodes" on this machine (127.0.0.1, Gloo on the CPU) in one c10d rendezvous, as the multi-node
command of docs/multi-node.md and scripts/slurm_multinode.sbatch start them: a worker killed outright, a frozen node."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.source_copy import copy_source_tree
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
         "train.eval_iters=2", "train.warmup_iters=1", "train.log_interval=1", "train.device=cpu",
         "train.eval_interval=100", "train.global_batch_size=4"]
WAIT_S = 300


def torchrun_node(endpoint: str, run_id: str | None, *args: str, max_restarts: int = 0) -> list[str]:
    """One node's torchrun of a two-node c10d job, one worker per node (run id None: torchrun's default)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", *([f"--rdzv-id={run_id}"] if run_id else []),
            f"--max-restarts={max_restarts}", "--local-addr=127.0.0.1", *args]


def start_node(command: list[str], repo: Path, log: Path, cwd: Path | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=cwd or repo, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def stop_all(nodes: list[subprocess.Popen]) -> None:
    """SIGKILL what is left of the nodes: the process group of each process a node started (torchrun starts each
    worker in a session of its own), its workers' first."""
    for node in nodes:
        signal_process_groups(node, signal.SIGKILL)
        node.wait(timeout=30)


def signal_process_groups(node: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to every process group in ``node``'s process tree, its deepest processes' first."""
    for pid in reversed(process_tree(node.pid)):
        try:
            os.killpg(os.getpgid(pid), signum)
        except ProcessLookupError:
            pass


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it, parents before their children."""
    return [pid, *(descendant for child in children(pid) for descendant in process_tree(child))]


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:  # gone
        return []


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has, its parent not having read its status)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"  # the state follows the command's name, in parentheses


def workers(agent: subprocess.Popen) -> list[int]:
    return children(agent.pid)


def losses(run_dir: Path) -> dict[int, float]:
    """The last logged train loss of each step (a resumed run logs its steps again)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def two_node_job(tmp_path: Path, *overrides: str, max_restarts: int = 0, repos=(REPO, REPO), during=None,
                 run_id: str | None = "job", cwd: Path | None = None) -> list[subprocess.Popen]:
    """Start both nodes (node i runs ``repos[i]``'s train.py), call ``during(nodes)`` while they run, wait for
    both; returns the finished nodes."""
    endpoint = f"127.0.0.1:{warm_python.free_port()}"
    run_id = run_id and f"{run_id}-{uuid.uuid4().hex[:8]}"
    nodes = []
    try:
        for index, repo in enumerate(repos):
            command = torchrun_node(endpoint, run_id, str(repo / "train.py"), *SMALL, *overrides,
                                    max_restarts=max_restarts)
            nodes.append(start_node(command, repo, tmp_path / f"node{index}.log", cwd))
        if during is not None:
            during(nodes)
        for node in nodes:
            node.wait(timeout=WAIT_S)
        return nodes
    finally:
        stop_all(nodes)


def logs(tmp_path: Path) -> str:
    return "\n".join(path.read_text() for path in sorted(tmp_path.glob("node*.log")))


@pytest.fixture(scope="module")
def uninterrupted_run(tmp_path_factory) -> Path:
    """The 12-step run the killed-and-resumed jobs must reproduce, made once for them (no test changes it)."""
    reference = tmp_path_factory.mktemp("uninterrupted")
    warm_python.run([sys.executable, "train.py", f"hydra.run.dir={reference}", *SMALL, "train.max_iters=12"],
                    cwd=REPO, check=True, timeout=WAIT_S)
    return reference


def kill_a_worker_and_resume(tmp_path: Path, victim: int, reference: Path) -> None:
    """SIGKILL node ``victim``'s worker after the step-4 checkpoint: both nodes restart their workers, which
    resume from that checkpoint and end with the losses of ``reference``, a run that was never interrupted."""
    run_dir = tmp_path / "killed"
    killed = []

    def kill_after_checkpoint(nodes):
        wait_for(lambda: (run_dir / "checkpoints" / "ckpt_00000004.pt").exists(), WAIT_S, "the step-4 checkpoint")
        pid = workers(nodes[victim])[0]
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    nodes = two_node_job(tmp_path, f"hydra.run.dir={run_dir}", "train.max_iters=12", "train.checkpoint_interval=4",
                         "train.resume=true", max_restarts=2, during=kill_after_checkpoint)
    assert [node.returncode for node in nodes] == [0, 0], logs(tmp_path)
    assert killed
    assert "resumed from" in logs(tmp_path)
    assert losses(run_dir) == pytest.approx(losses(reference), rel=1e-6)
    assert sorted(losses(run_dir)) == list(range(1, 13))


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 0, 1], ids=["node1", "node0", "node1-again"])
def test_a_killed_worker_restarts_both_nodes_under_c10d_and_the_run_resumes_exactly(tmp_path, uninterrupted_run,
                                                                                    victim):
    # Under c10d only the node whose worker died counts a restart (TORCHELASTIC_RESTART_COUNT=1); the other
    # restarts as a membership change and keeps 0. The restarted group must still find each other, every time:
    # three tries here (the machine is small), ten in a row by hand (see docs/multi-node.md).
    kill_a_worker_and_resume(tmp_path, victim, uninterrupted_run)


@pytest.mark.slow
@pytest.mark.parametrize("frozen_after", ["start", "ckpt_00000002.pt"])
def test_a_frozen_node_ends_the_job_after_the_distributed_timeout(tmp_path, frozen_after):
    # Node 1's worker is stopped (SIGSTOP) as soon as it exists, or once training is under way: node 0's worker
    # waits for it to join or in the step's all-reduce, and gives up after train.distributed_timeout_s (torch's
    # own default would be 30 minutes).
    run_dir = tmp_path / "frozen"
    checkpoint = run_dir / "checkpoints" / frozen_after

    def freeze_node_1(nodes):
        wait_for(lambda: workers(nodes[1]) and (frozen_after == "start" or checkpoint.exists()), WAIT_S,
                 f"node 1's worker at {frozen_after}")
        os.kill(workers(nodes[1])[0], signal.SIGSTOP)
        frozen = time.monotonic()
        nodes[0].wait(timeout=WAIT_S)
        waited.append(time.monotonic() - frozen)
        stop_all(nodes[1:])

    waited = []
    nodes = two_node_job(tmp_path, f"hydra.run.dir={run_dir}", "train.max_iters=1000", "train.checkpoint_interval=2",
                         "train.distributed_timeout_s=5", during=freeze_node_1)
    assert nodes[0].returncode != 0, logs(tmp_path)
    assert 5 <= waited[0] < 60


# training/schedule.py is imported before the ranks compare their code; the optimizers in mars/ only after.
@pytest.mark.slow
@pytest.mark.parametrize("edited", ["training/schedule.py", "mars/torch_backend.py"])
def test_a_node_running_a_changed_copy_without_git_stops_the_job(tmp_path, edited):
    # Node 1 runs a copy of the repository without .git (git cannot tell its commit) in which one line of one
    # file differs: the source files the ranks hold tell, and every rank stops.
    copy = tmp_path / "copy"
    copy_source_tree(copy)
    (copy / edited).write_text((copy / edited).read_text() + "# edited on this node only\n")
    nodes = two_node_job(tmp_path, f"hydra.run.dir={tmp_path / 'run'}", "train.max_iters=2", repos=(REPO, copy))
    assert [node.returncode != 0 for node in nodes] == [True, True], logs(tmp_path)
    for node in ("node0.log", "node1.log"):  # told once on each node, by its first rank
        told = [line for line in (tmp_path / node).read_text().splitlines() if line.startswith("error: the ranks")]
        assert len(told) == 1 and "holds other source files than rank 0" in told[0], logs(tmp_path)
    assert edited in logs(tmp_path)
    assert not list((tmp_path / "run").rglob("ckpt_*.pt"))


@pytest.mark.slow
def test_torchrun_without_a_run_id_refuses_a_default_run_directory(tmp_path):
    # torchrun's default run id (no --rdzv-id) is "none" in every job: a timestamp per rank would split the ranks
    # (and each restart) into directories of their own. Started from tmp_path, so that outputs/ lands there.
    nodes = two_node_job(tmp_path, "train.max_iters=2", run_id=None, cwd=tmp_path)
    assert [node.returncode != 0 for node in nodes] == [True, True], logs(tmp_path)
    refusal, *others = [line for line in logs(tmp_path).splitlines()  # told once on each node, by its first rank
                        if line.startswith("error: under torchrun without --rdzv-id the ranks cannot agree")]
    assert others == [refusal], logs(tmp_path)
    assert f"traceback : {refusal}" in logs(tmp_path)  # torchrun's summary names it as the failure's root cause
    assert "InterpolationResolutionError" not in logs(tmp_path)  # no warning, no traceback of Hydra's
    assert not list(tmp_path.rglob("metrics.jsonl"))


@pytest.mark.slow
def test_torchrun_with_a_run_id_gives_every_rank_one_default_run_directory(tmp_path):
    nodes = two_node_job(tmp_path, "train.max_iters=2", cwd=tmp_path)
    assert [node.returncode for node in nodes] == [0, 0], logs(tmp_path)
    [metrics] = tmp_path.rglob("metrics.jsonl")
    assert metrics.parent.parent.name == "outputs"
    # The launch record names the real launch: torchrun's arguments, and the overrides.
    [launch] = [json.loads(line)["launch"] for line in metrics.read_text().splitlines() if '"launch"' in line]
    assert "--nnodes=2" in launch["torchrun"] and "--rdzv-backend=c10d" in launch["torchrun"]
    # Every rank's code is recorded, not only rank 0's.
    assert len(launch["ranks"]) == 2 and len({rank["source_sha256"] for rank in launch["ranks"]}) == 1
    assert launch["command"] == [*SMALL, "train.max_iters=2"]
