"""scripts/launch_single_node.sh with two CPU processes (Gloo): what a refused run leaves on screen."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
         "train.device=cpu", "train.max_iters=2"]


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
