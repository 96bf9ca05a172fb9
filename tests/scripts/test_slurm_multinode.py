"""scripts/slurm_multinode.sbatch in a fake SLURM allocation: srun runs its command once, torchrun reports its
arguments."""
import os
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAKE_TOOLS = {
    # More hosts than a pipe holds: a reader that stops after the first line would end scontrol with SIGPIPE.
    "scontrol": 'echo "${SLURM_JOB_NODELIST%%,*}"; printf "other-node%d\\n" $(seq 100000)\n',
    "srun": 'exec "$@"\n',
    "torchrun": 'printf "%s\\n" "$@" > "$TORCHRUN_ARGS"\n',
}


def launch(tmp_path: Path, job_id: str, tools: dict[str, str] = FAKE_TOOLS,
           **env: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/usr/bin/env bash\n" + body)
        (bin_dir / name).chmod(0o755)
    slurm = {"SLURM_SUBMIT_DIR": str(REPO), "SLURM_JOB_ID": job_id, "SLURM_JOB_NUM_NODES": "2",
             "SLURM_JOB_NODELIST": "gpu07,gpu08", "TORCHRUN_ARGS": str(tmp_path / f"args_{job_id}")}
    base = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_") and
            key != "GPUS_PER_NODE"}
    return subprocess.run(["bash", str(REPO / "scripts/slurm_multinode.sbatch"), "optimizer=adamw"],
                          env={**base, **slurm, **env, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=60)


def torchrun_args(tmp_path: Path, job_id: str) -> list[str]:
    return (tmp_path / f"args_{job_id}").read_text().splitlines()


def test_each_node_runs_one_process_per_gpu_that_slurm_granted(tmp_path):
    result = launch(tmp_path, "4242", SLURM_GPUS_ON_NODE="4")
    assert result.returncode == 0, result.stderr
    args = torchrun_args(tmp_path, "4242")
    assert "--nproc_per_node=4" in args and "--nnodes=2" in args
    assert args[-3:] == ["hydra.run.dir=outputs/slurm-4242", "train.resume=true", "optimizer=adamw"]


def test_two_jobs_on_one_head_node_meet_at_different_rendezvous_ports(tmp_path):
    for job_id in ("4242", "4243"):
        assert launch(tmp_path, job_id, SLURM_GPUS_ON_NODE="8").returncode == 0
    endpoints = [next(a for a in torchrun_args(tmp_path, job) if a.startswith("--rdzv_endpoint="))
                 for job in ("4242", "4243")]
    assert endpoints[0].startswith("--rdzv_endpoint=gpu07:") and endpoints[0] != endpoints[1]
    assert all(15000 <= int(endpoint.rsplit(":", 1)[1]) < 30000 for endpoint in endpoints)


def endpoint_port(tmp_path: Path, job_id: str) -> int:
    endpoint = next(a for a in torchrun_args(tmp_path, job_id) if a.startswith("--rdzv_endpoint="))
    return int(endpoint.rsplit(":", 1)[1])


def test_two_running_jobs_whose_ids_give_the_same_port_meet_at_different_ports(tmp_path):
    # Job 5001's torchrun holds its rendezvous port (as c10d's store does) while job 20001 starts on the same
    # first node: 15000 + id % 15000 is 20001 for both.
    holding = {**FAKE_TOOLS, "torchrun": FAKE_TOOLS["torchrun"] + """port=$(sed -n 's/^--rdzv_endpoint=.*://p' "$TORCHRUN_ARGS")
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("", int(sys.argv[1]))); s.listen(); open(sys.argv[2], "w").close(); time.sleep(60)' \
    "$port" "$TORCHRUN_ARGS.listening" >/dev/null 2>&1 &
echo $! > "$TORCHRUN_ARGS.pid"
while [ ! -e "$TORCHRUN_ARGS.listening" ]; do sleep 0.05; done
"""}
    try:
        assert launch(tmp_path, "5001", tools=holding, SLURM_GPUS_ON_NODE="8").returncode == 0
        result = launch(tmp_path, "20001", SLURM_GPUS_ON_NODE="8")
    finally:
        os.kill(int((tmp_path / "args_5001.pid").read_text()), 9)
    assert result.returncode == 0, result.stderr
    assert endpoint_port(tmp_path, "5001") == 20001
    assert endpoint_port(tmp_path, "20001") == 20002


def test_the_port_search_wraps_within_its_range_and_says_when_every_port_is_taken():
    from scripts.free_port import first_free_port
    with socket.socket() as held:
        held.bind(("", 0))
        port = held.getsockname()[1]
        assert first_free_port(port, port - 1, port + 1) == port - 1
        assert first_free_port(port, port, port + 1) is None


def test_a_job_granted_no_gpus_stops_saying_how_to_ask_for_them(tmp_path):
    result = launch(tmp_path, "4242")
    assert result.returncode == 1
    assert "SLURM_GPUS_ON_NODE is unset" in result.stderr and not (tmp_path / "args_4242").exists()


@pytest.mark.parametrize("granted", ["2", None])
def test_gpus_per_node_overrides_what_slurm_granted(tmp_path, granted):
    env = {"GPUS_PER_NODE": "1", **({"SLURM_GPUS_ON_NODE": granted} if granted else {})}
    assert launch(tmp_path, "4242", **env).returncode == 0
    assert "--nproc_per_node=1" in torchrun_args(tmp_path, "4242")


def test_a_refused_run_ends_the_job_log_with_its_one_line(tmp_path):
    # As torchrun does when a rank stopped with train.py's reason: its summary and traceback, then exit 1, having
    # copied the rank's error record to the file its TORCHELASTIC_ERROR_FILE names.
    message = "error: optimizer.lr=inf is not a finite number: give it a finite value"
    refusing = {**FAKE_TOOLS, "torchrun": f"""echo '{message}' >&2
echo '{{"message": {{"message": "{message}", "extraInfo": {{}}}}}}' > "$TORCHELASTIC_ERROR_FILE"
echo 'torch.distributed.elastic.multiprocessing.errors.ChildFailedError:' >&2; exit 1
"""}
    result = launch(tmp_path, "4242", tools=refusing, SLURM_GPUS_ON_NODE="8")
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == message, result.stderr
