"""scripts.bench_authors_trainers on the CPU (the timing itself needs a GPU and their checkout): both sides run the
same step of the same model, theirs unpatched from their config file, and each side's step times are read as
it reports them."""
import sys
from pathlib import Path

import pytest

from configs.compose import compose_config
from scripts import bench_authors_trainers as bench
from tests import warm_python

REPO_ROOT = Path(__file__).resolve().parents[2]


def their_printed_line(iter_num, lossf, dt, running_mfu):
    """A line as their trainer prints it (MARS/train_mars.py:416, the same in train_adamw.py and train_muon.py)."""
    return f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%"


def test_their_step_times_are_the_printed_ones_from_the_skipped_iteration_on():
    output = "\n".join(["Overriding: max_iters = 60", "step 0: train loss 10.9, val loss 10.9",
                        their_printed_line(0, 10.95, 41.2, -1.0), their_printed_line(10, 7.1234, 0.25112, 0.31),
                        their_printed_line(20, 6.5, 0.2499, 0.312)])
    assert bench.their_step_ms(output, skip=10) == [251.12, 249.9]
    assert bench.their_step_ms(output, skip=0) == [41200.0, 251.12, 249.9]


def test_our_step_times_follow_as_many_updates_as_their_iterations():
    records = [{"step": step, "step_ms": 100.0 + step} for step in range(1, 14)] + [{"step": 13, "val/loss": 5.0}]
    # Our step k follows k - 1 updates, their iteration k - 1: from iteration 10 on is from our step 11 on.
    assert bench.our_step_ms(records, skip=10) == [111.0, 112.0, 113.0]


@pytest.mark.parametrize("family", bench.FAMILIES, ids=lambda family: family.name)
def test_both_sides_take_their_step_and_theirs_runs_their_file_and_config_unchanged(family, tmp_path):
    authors = tmp_path / "authors"
    theirs = bench.their_command(family, authors, 60, "owt", tmp_path / "theirs")
    assert theirs[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    runner = theirs.index(str(bench.RUNNER))
    assert theirs[runner + 1:runner + 3] == ["--patches", str(tmp_path / "theirs" / "patches.json")]
    trainer = theirs.index(str(authors / family.trainer))
    assert theirs[trainer + 1] == str(authors / family.config)
    # Only the run's length, its evaluation, its data and where it writes: their config file sets the step.
    overridden = {argument[2:].split("=")[0] for argument in theirs[trainer + 2:]}
    assert overridden == {"max_iters", "eval_interval", "eval_iters", "dataset", "out_dir"}

    ours = bench.our_command(family, 60, tmp_path / "data", tmp_path / "ours")
    assert ours[1:5] == theirs[1:5]
    cfg = compose_config([argument for argument in ours[ours.index(str(REPO_ROOT / "train.py")) + 1:]
                          if not argument.startswith("hydra.")])
    # Their config files: batch_size 15, block_size 1024, gradient_accumulation_steps 4 on one process.
    assert (cfg.train.batch_size, cfg.train.global_batch_size, cfg.train.block_size) == (15, 60, 1024)
    assert (cfg.model.n_layer, cfg.model.n_embd, cfg.train.compile, cfg.train.dtype) == (12, 768, True, "bfloat16")
    assert cfg.optimizer.name == {"adamw": "adamw", "mars": "mars", "muon": "muon"}[family.name]


def test_a_run_is_refused_in_one_line_on_a_machine_without_a_gpu(tmp_path):
    result = warm_python.run([sys.executable, "-m", "scripts.bench_authors_trainers", "--authors-dir", str(tmp_path),
                              "--output-dir", str(tmp_path / "results")], cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "bench_authors_trainers times the trainers on a GPU, and this machine has none"]
    assert not (tmp_path / "results").exists()


def test_the_table_gives_each_sides_median_and_their_ratio():
    timings = {"mars": {"theirs_ms": [250.0, 260.0, 240.0], "ours_ms": [150.0, 140.0], "theirs_median_ms": 250.0,
                        "ours_median_ms": 145.0, "ratio": 0.58}}
    rows = bench.markdown_table(timings).splitlines()
    assert rows[2] == ("| mars | `MARS/train_mars.py` | `owt-gpt2-small-50b-mars-approx` | 250.0 (3 steps) "
                       "| 145.0 (2 steps) | 0.58x |")
