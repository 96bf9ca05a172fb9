"""Data-parallel training with torchrun on the CPU (Gloo), as on a cluster but with 2 processes."""
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from configs.compose import CONFIG_DIR, compose_config
from configs.registry import OPTIMIZERS
from model import ARCHITECTURES
from reporting.run_reading import load_run
from training.metrics import read_metrics
from tests import warm_python
from tests.training.optimizer_configs import registered_configs

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=32",
         "train.eval_iters=2", "train.warmup_iters=1", "train.log_interval=1", "train.device=cpu",
         "train.max_iters=4", "train.eval_interval=2", "train.checkpoint_interval=4"]
# shutdown_distributed's warning: a rank that holds the process group past its destruction may hang or abort as it
# exits.
GROUP_LEAK = "still referenced after destroy_process_group"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


def run(run_dir, *overrides, ranks=1):
    """train.py in one process, or as ``ranks`` data-parallel ranks (forked: ``warm_python.run_ranks``; the tests
    of torchrun itself launch it); (records, step-4 checkpoint)."""
    command = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", *SMALL, *overrides]
    results = (warm_python.run_ranks(command, world_size=ranks, cwd=REPO, timeout=600) if ranks > 1 else
               [warm_python.run(command, cwd=REPO, timeout=600)])
    for result in results:
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
        assert GROUP_LEAK not in result.stdout + result.stderr, result.stderr
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    checkpoint = torch.load(Path(run_dir) / "checkpoints" / "ckpt_00000004.pt", weights_only=True)
    return records, checkpoint


def losses(records, key):
    return [r[key] for r in records if key in r]


def run_script(script, *args):
    """A script of this folder as the two ranks of one job (forked: ``warm_python.run_ranks``), the ranks' output
    joined as torchrun joins it; its exit status is the first failed rank's."""
    command = [sys.executable, "-m", f"tests.training.{Path(script).stem}", *args]
    ranks = warm_python.run_ranks(command, world_size=2, cwd=REPO, timeout=300)
    assert not any(GROUP_LEAK in rank.stdout + rank.stderr for rank in ranks), "".join(r.stderr for r in ranks)
    return subprocess.CompletedProcess(command, next((r.returncode for r in ranks if r.returncode), 0),
                                       "".join(r.stdout for r in ranks), "".join(r.stderr for r in ranks))


@pytest.mark.slow
def test_one_read_per_step_gives_every_rank_the_mean_loss_the_norms_any_ranks_stop_signal_and_bad_token_ids():
    result = run_script("step_scalars.py")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "shard 0 holds token id 57 at token 6, but model.vocab_size is 50" in result.stdout  # on both ranks


@pytest.mark.slow
def test_ranks_holding_different_code_all_stop_before_training():
    result = run_script("different_code.py")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert result.stdout.count("the ranks of this job run different code") == 2


def test_a_single_process_reads_its_own_step_scalars():
    from data.loader import TokenBatches
    from train import read_step_scalars
    from training.distributed import DistributedContext

    batches = TokenBatches(np.arange(64) % 50, "train", batch_size=1, block_size=4, seed=0, vocab_size=50)
    loss, norms = torch.tensor(2.5, dtype=torch.float64), (torch.tensor(float("nan")), torch.tensor(0.0))
    assert read_step_scalars(loss, *norms, True, batches, DistributedContext())[::3] == (2.5, True)
    assert read_step_scalars(loss, *norms, False, batches, DistributedContext())[3] is False
    assert str(read_step_scalars(loss, *norms, False, batches, DistributedContext())[1]) == "nan"


def test_a_single_process_stops_at_the_batch_holding_a_token_id_beyond_the_vocabulary():
    from data.loader import TokenBatches, TokenIdOutOfRange

    tokens = np.arange(64) % 50
    tokens[21] = 99
    batches = TokenBatches(tokens, "train", batch_size=2, block_size=4, seed=0, sampling="sequential",
                           vocab_size=50)
    batches.batch(step=1)  # windows 2 and 3: tokens 8 to 16
    with pytest.raises(TokenIdOutOfRange, match="holds token id 99 at token 21, but model.vocab_size is 50"):
        batches.batch(step=2)  # tokens 16 to 24


def test_every_registered_optimizer_has_a_config_that_the_ddp_and_zero1_checks_run():
    # The two-rank runs below train one config of each registered optimizer; ddp_invariants.py checks DDP and
    # ZeRO-1 on every config.
    assert registered_configs().keys() == OPTIMIZERS.keys()


@functools.cache
def optimizer_keys(optimizer: str) -> frozenset[str]:
    return frozenset(compose_config([f"optimizer={optimizer}"]).optimizer)


def gloo_options(optimizer: str, global_batch_size: int = 8) -> list[str]:
    """The options of the two-rank comparisons with ``optimizer``: ``global_batch_size`` sequences of 2 a step
    (with 8: accumulation 4 in one process, 2 on each of two ranks, no_sync on the first micro-batch and the
    all-reduce on the second; with 4: accumulation 2 in one process, 1 on each rank)."""
    # Newton-Schulz in float32: the two ranks share out its work, and float32 keeps this 1-layer run fast on a CPU.
    # float32 updates too: one process and two ranks sum the gradients in different orders, and rounding the
    # update to bfloat16 (the authors' Muon) turns those last-bit differences into whole bfloat16 steps.
    options = [f"optimizer={optimizer}", f"train.global_batch_size={global_batch_size}"]
    options += [f"optimizer.{key}=float32" for key in ("ns_dtype", "update_dtype") if key in optimizer_keys(optimizer)]
    # The authors' summed gradients (4x the mean) must not depend on how the batch is split into ranks either.
    options += ["train.grad_multiplier=4"]
    # HellaSwag too: the two ranks score alternate items and add up their counts.
    return options + ["train.hellaswag_interval=2",
                      f"train.hellaswag_file={REPO / 'tests/evaluation/hellaswag_sample.jsonl'}"]


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    """The two-rank DDP run with ``gloo_options(optimizer)`` (2 micro-batches a rank), (records, checkpoint), made
    once for the tests of this module that compare against it (under pytest-xdist, once per worker that runs such a
    test). No test may change its directory."""
    runs = {}

    def run_once(optimizer: str):
        if optimizer not in runs:
            runs[optimizer] = run(tmp_path_factory.mktemp(f"ddp-{optimizer}"), *gloo_options(optimizer), ranks=2)
        return runs[optimizer]

    return run_once


def assert_same_records(one: list[dict], two: list[dict]) -> None:
    """What a run of two ranks records as a run of one process does: the global batch, the data, HellaSwag."""
    assert len(losses(one, "hellaswag/acc_norm")) == 2
    assert losses(two, "hellaswag/acc_norm") == losses(one, "hellaswag/acc_norm")
    tokens = [r["tokens"] for r in one if "tokens" in r]
    assert [r["tokens"] for r in two if "tokens" in r] == tokens and tokens  # the global batch counts every rank
    assert [r["data"] for r in two if "data" in r] == [r["data"] for r in one if "data" in r]  # rank 0 records it
    assert [(r["launch"]["world_size"], len(r["launch"]["hosts"])) for r in two if "launch" in r] == [(2, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", registered_configs().values())
def test_two_gloo_ranks_of_one_micro_batch_train_bit_for_bit_as_one_process_of_two(tmp_path, optimizer):
    # One micro-batch a rank: the all-reduce adds the same two gradients as the one process's accumulation, and
    # a + b is b + a in floating point, so every loss, norm, weight and state is the same to the bit, whatever
    # the CPU's vector kernels (the scaling by grad_multiplier / accumulation and by 1 / world_size is by powers of
    # two, exact; the losses are summed in float64, where a few float32 losses add exactly).
    one, one_ckpt = run(tmp_path / "one", *gloo_options(optimizer, global_batch_size=4))
    two, two_ckpt = run(tmp_path / "two", *gloo_options(optimizer, global_batch_size=4), ranks=2)
    for key in ("train/loss", "val/loss", "grad_norm"):
        assert losses(two, key) == losses(one, key) and losses(one, key), key
    assert_same_records(one, two)
    for name, tensor in one_ckpt["model"].items():
        assert torch.equal(two_ckpt["model"][name], tensor), name
    for index, state in one_ckpt["optimizer"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(two_ckpt["optimizer"]["state"][index][key]), torch.as_tensor(value))
    assert len(two_ckpt["rng"]) == 2  # one random state per rank, for an exact resume


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", registered_configs().values())
def test_two_gloo_ranks_accumulating_with_no_sync_sum_every_micro_batch_as_one_process(tmp_path, two_rank_run,
                                                                                    optimizer):
    # Two micro-batches a rank: no_sync on the first, the all-reduce on the second, so the step's gradient is
    # (a + b) + (c + d) where one process accumulates ((a + b) + c) + d. The two differ by the rounding of one
    # float32 addition an element (on CPUs with AVX-512 kernels the micro-batch gradients are not those of the
    # default kernels, so which elements round apart differs by machine). The weights then differ by more than
    # that rounding, and by no bound that follows from it: each later gradient is taken at weights that already
    # differ, and Adam's per-element normalisation divides an element's rounding by that element's own gradient,
    # which is small where its micro-batches' contributions cancel (Moonlight's AdamW on the tied embedding at lr
    # 6e-3: 2.2e-6 in element (271, 25) of 1.6M after 4 steps with AVX-512 kernels, 1.1e-6 with the default
    # ones; measured 2026-12-01 by torch.testing.assert_close of the two runs' step-4 weights, as this test once did). The weights are compared where equality is exact (the test above); here, what no_sync could get
    # wrong: a micro-batch's gradient lost or counted twice changes the gradient norm of the very first step,
    # taken at the same weights, by far more than the rounding, and every loss after it.
    one, _ = run(tmp_path / "one", *gloo_options(optimizer))
    two, _ = two_rank_run(optimizer)
    first_norms = losses(one, "grad_norm")[0], losses(two, "grad_norm")[0]
    assert first_norms[1] == pytest.approx(first_norms[0], rel=4 * torch.finfo(torch.float32).eps)
    assert losses(two, "train/loss") == pytest.approx(losses(one, "train/loss"), rel=1e-6)
    assert losses(two, "val/loss") == pytest.approx(losses(one, "val/loss"), rel=1e-6)
    assert losses(two, "grad_norm") == pytest.approx(losses(one, "grad_norm"), rel=1e-5)
    assert_same_records(one, two)


@pytest.mark.slow
def test_every_rank_reaches_the_same_parameters():
    # One launch checks every optimizer config in turn, unsharded and under ZeRO-1: a failed check names its config.
    result = run_script("ddp_invariants.py")
    assert result.returncode == 0, result.stderr
    configs = sorted(path.stem for path in Path(CONFIG_DIR, "optimizer").glob("*.yaml"))
    assert result.stdout.splitlines() == [f"checked {name} on {arch}" for name in configs for arch in ARCHITECTURES]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the threads' names in /proc (Linux)")
def test_a_failed_training_block_ends_the_gloo_group_before_the_interpreter_exits():
    # Gloo worker threads left running into interpreter finalization abort both ranks at random (SIGABRT):
    # pinned down deterministically by the threads being gone, though the optimizers and the error outlive it.
    result = run_script("gloo_shutdown.py")
    assert result.returncode == 0, result.stderr


def zero1_trains_like_ddp(tmp_path, two_rank_run, optimizer, state_key, checkpoint_interval=4):
    """Train with ZeRO-1 under torchrun; assert the losses, weights and (gathered) state of the same run without.
    Returns the ZeRO-1 run's records."""
    plain, plain_ckpt = two_rank_run(optimizer)
    sharded, sharded_ckpt = run(tmp_path / "zero1", *gloo_options(optimizer), "train.zero1=true",
                                f"train.checkpoint_interval={checkpoint_interval}", ranks=2)
    assert losses(sharded, "train/loss") == pytest.approx(losses(plain, "train/loss"), rel=1e-6)
    for name, tensor in plain_ckpt["model"].items():
        torch.testing.assert_close(sharded_ckpt["model"][name], tensor, rtol=1e-5, atol=1e-6)
    # The checkpoint gathers every rank's shard: the whole state, remembered gradients included.
    assert len(sharded_ckpt["optimizer"]["state"]) == len(plain_ckpt["optimizer"]["state"])
    matrices = [s for s in sharded_ckpt["optimizer"]["state"].values() if state_key(s)]
    assert matrices and all("last_grad" in s for s in matrices)
    return sharded


@pytest.mark.slow
def test_zero1_sharded_mars_adamw_trains_like_unsharded_and_resumes_exactly_from_its_gathered_checkpoint(
        tmp_path, two_rank_run):
    full = zero1_trains_like_ddp(tmp_path, two_rank_run, "mars-adamw", lambda s: s["exp_avg"].dim() == 2,
                                 checkpoint_interval=2)
    (tmp_path / "zero1" / "checkpoints" / "ckpt_00000004.pt").unlink()
    resumed, _ = run(tmp_path / "zero1", *gloo_options("mars-adamw"), "train.zero1=true",
                     "train.checkpoint_interval=2", "train.resume=true", ranks=2)
    assert losses(resumed, "train/loss") == losses(full, "train/loss")


@pytest.mark.slow
def test_a_run_resumed_by_more_processes_records_the_global_batch_it_doubles(tmp_path):
    run(tmp_path, "train.grad_accum_steps=2")  # 2 x 2 accumulation x 1 process
    resumed = warm_python.run_ranks([sys.executable, "train.py", f"hydra.run.dir={tmp_path}", *SMALL,
                                     "train.grad_accum_steps=2", "train.max_iters=6", "train.resume=true"],
                                    world_size=2, cwd=REPO, timeout=600)
    assert [rank.returncode for rank in resumed] == [0, 0], resumed[0].stderr + resumed[1].stderr
    message = "changed on resume: train.global_batch_size 4 -> 8 (from step 4 on)"
    assert message in resumed[0].stdout, resumed[0].stdout
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    event = next(r for r in records if "changed" in r)
    assert event["step"] == 4
    assert event["changed"] == {"processes": [1, 2], "train.global_batch_size": [4, 8], "train.max_iters": [4, 6]}
    # The tables keep the run apart from its seeds for the batch, not only for train.max_iters.
    changed_on_resume = json.loads(load_run(tmp_path).setting)["changed_on_resume"]
    assert changed_on_resume[0]["changed"]["train.global_batch_size"] == [4, 8]


@pytest.mark.slow
def test_a_refused_config_is_told_once_by_rank_0_and_is_torchruns_root_cause(tmp_path):
    result = subprocess.run([*TORCHRUN, "train.py", f"hydra.run.dir={tmp_path}", *SMALL, "optimizer.lr=inf"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    message = "error: optimizer.lr=inf is not a finite number: give it a finite value"
    assert result.returncode != 0
    assert output.splitlines().count(message) == 1, output  # rank 0's line; rank 1 exits quietly
    assert f"traceback : {message}" in output  # torchrun's summary names it as the failure's root cause
    assert 'train.py", line' not in output  # no traceback of the workers


def ctrl_c_once_training(command, run_dir, env=None) -> str:
    """Run ``command`` as a terminal runs a job (its own process group) and press Ctrl-C once it trains: SIGINT to
    the whole group, as the terminal sends it. Returns the job's output once it has ended."""
    output = open(Path(run_dir).parent / f"{Path(run_dir).name}.out", "w+")
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    metrics, deadline = Path(run_dir) / "metrics.jsonl", time.monotonic() + 300
    while '"train/loss"' not in (metrics.read_text() if metrics.exists() else ""):
        assert job.poll() is None and time.monotonic() < deadline, "the run did not train"
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGINT)
    job.wait(timeout=300)
    output.seek(0)
    return output.read()


def follow_resume_line(line: str, env=None, cwd=REPO) -> str:
    """Run a printed ``resume: ...`` line as a user would paste it into a shell in ``cwd``; returns its output."""
    result = subprocess.run(["bash", "-c", line.split("resume: ", 1)[1]], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert result.returncode == 0, result.stdout
    return result.stdout


def launches(run_dir) -> list[dict]:
    return [r["launch"] for r in read_metrics(run_dir) if "launch" in r]


@pytest.mark.slow
def test_the_resume_line_after_ctrl_c_under_torchrun_resumes_with_torchrun_and_the_same_global_batch(tmp_path):
    run_dir = tmp_path / "run"
    output = ctrl_c_once_training([*TORCHRUN, "train.py", f"hydra.run.dir={run_dir}", *SMALL, "train.max_iters=40",
                                   "train.eval_interval=20", "train.checkpoint_interval=40"], run_dir)
    resume, = [line for line in output.splitlines() if "] - resume: " in line]
    assert shlex.split(resume.split("resume: ")[1])[:8] == ["cd", str(REPO), "&&", *TORCHRUN], resume
    resumed = follow_resume_line(resume)
    assert "2 processes | global batch 128 tokens" in resumed, resumed
    assert "run finished at step 40 of 40" in resumed, resumed
    assert [launch["world_size"] for launch in launches(run_dir)] == [2, 2]
