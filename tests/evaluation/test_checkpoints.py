"""The checkpoint an evaluation command reads from a run directory: that of a run still training too, whose pruning
(train.keep_checkpoints) deletes checkpoints while they are read."""
import sys
import time
from pathlib import Path

import torch

from evaluation.checkpoints import newest_checkpoint
from training.checkpoint import checkpoint_step
from tests import warm_python
from tests.test_one_line_errors import SMALL, environment

REPO = Path(__file__).resolve().parents[2]
# Readings of this many checkpoints meet deletions under them: before the reader read again, this test failed by
# the 4th checkpoint in each of 3 runs.
CHECKPOINTS_SEEN = 12


def test_a_live_run_pruning_the_checkpoint_being_read_gives_its_newer_one(tmp_path):
    run_dir = tmp_path / "run"
    # A checkpoint every step and only the newest kept: each save deletes the previous one, which a reading listed
    # and is checking (its checksums, a third of a reading's time) until it opens it again to load it.
    process = warm_python.start([sys.executable, str(REPO / "train.py"), f"hydra.run.dir={run_dir}", *SMALL,
                                 "train.max_iters=100000", "train.eval_interval=100000", "train.checkpoint_interval=1",
                                 "train.keep_checkpoints=1"], cwd=REPO, env=environment({}),
                                stdout=tmp_path / "out", stderr=tmp_path / "err")
    steps = set()
    try:
        deadline = time.monotonic() + 300
        while len(steps) < CHECKPOINTS_SEEN:
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
            found = newest_checkpoint(run_dir, torch.device("cpu"))
            if found is None:  # before the first checkpoint
                time.sleep(0.05)
                continue
            path, state = found
            assert state["step"] == checkpoint_step(path)
            steps.add(state["step"])
    finally:
        process.kill()
        process.wait(timeout=60)
