"""scripts/launch_single_node.sh with two CPU processes (Gloo): what a refused run leaves on screen."""
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training.test_distributed import ctrl_c_once_training, follow_resume_line, launches
from tests.shell import shell_without_the_venv

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
         "train.device=cpu", "train.max_iters=2"]


@pytest.mark.slow
def test_a_refused_run_ends_with_its_one_line_after_torchruns_summary(tmp_path):
    env = {**os.environ, "NPROC": "2", "RUN_DIR": str(tmp_path / "run"), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", "scripts/launch_single_node.sh", *SMALL, "optimizer.lr=inf"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    message = "error: optimizer.lr=inf is not a finite number: give it a finite value"
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout
    assert "ChildFailedError" in result.stdout  # torchrun's own traceback comes first ...
    assert lines[-1] == message, result.stdout  # ... and the reason is the last line
    assert lines.count(message) == 2  # rank 0's line as it stopped, and the last one; none from rank 1


@pytest.mark.slow
def test_a_sigterm_to_the_script_reaches_every_rank_which_checkpoint_their_step(tmp_path):
    # A scheduler preempting a job signals the script it started; torchrun runs as its child. torchrun itself
    # exits 1 on SIGTERM whatever its workers do, and the script passes that on, as docs/multi-node.md says.
    run_dir = tmp_path / "run"
    env = {**os.environ, "NPROC": "2", "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    script = subprocess.Popen(["bash", "scripts/launch_single_node.sh", *SMALL, "train.max_iters=100000",
                               "train.log_interval=1"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while '"train/loss"' not in (metrics.read_text() if metrics.exists() else ""):
        assert script.poll() is None and time.monotonic() < deadline, script.communicate()[0]
        time.sleep(0.5)
    script.send_signal(signal.SIGTERM)
    output = script.communicate(timeout=300)[0]
    assert "on a termination signal" in output and "resume: " in output, output
    assert list((run_dir / "checkpoints").glob("ckpt_*.pt")), output
    assert script.returncode == 1, output


@pytest.mark.slow
def test_ctrl_c_ends_with_a_resume_line_that_reruns_the_script_with_the_same_process_count(tmp_path):
    # torchrun ends a Ctrl-C with its own traceback: the script prints the run's resume line again after it.
    run_dir = tmp_path / "run"
    env = {**os.environ, "NPROC": "2", "RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    output = ctrl_c_once_training(["bash", "scripts/launch_single_node.sh", *SMALL, "train.max_iters=40",
                                   "train.eval_iters=2", "train.eval_interval=20", "train.log_interval=1"],
                                  run_dir, env)
    last = output.splitlines()[-1]
    assert "SignalException" in output and last.startswith(f"resume: cd {REPO} && NPROC=2 TORCHRUN="), output
    assert shlex.split(last)[6] == str(REPO / "scripts" / "launch_single_node.sh"), last
    # The line alone says where, with how many processes and which torchrun: it runs as printed from another
    # directory, in a shell without the venv (nor torchrun) on its PATH.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    resumed = follow_resume_line(last, {**shell_without_the_venv(), "OMP_NUM_THREADS": "1"}, cwd=elsewhere)
    assert "2 processes | global batch 128 tokens" in resumed and "run finished at step 40 of 40" in resumed
    assert [launch["world_size"] for launch in launches(run_dir)] == [2, 2]
