"""End-to-end runs of train.py in subprocesses, as a user launches it."""
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from data.embedded import clean_play, play_files, prepare_embedded
from training.metrics import LAUNCH_KEYS
from tests import warm_python
from training.provenance import code_version

REPO = Path(__file__).resolve().parents[1]
SMALL = ["model.n_layer=2", "model.n_head=2", "model.n_embd=64", "train.batch_size=2", "train.block_size=32",
         "train.eval_iters=2", "train.warmup_iters=2", "train.log_interval=1", "train.device=cpu"]


def run_train(run_dir, *overrides, check=True):
    result = warm_python.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", *overrides], cwd=REPO,
                             timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"train.py failed:\n{result.stdout}\n{result.stderr}")
    return result


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def train_losses(records):
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


@pytest.mark.slow
def test_run_resumed_from_a_checkpoint_continues_exactly_like_the_uninterrupted_run(tmp_path):
    full = tmp_path / "full"
    run_train(full, *SMALL, "train.max_iters=8", "train.eval_interval=4", "train.checkpoint_interval=4")
    records = metrics(full)
    assert [r["step"] for r in records if "val/loss" in r] == [0, 4, 8]
    assert sorted(p.name for p in (full / "checkpoints").iterdir()) == ["ckpt_00000004.pt", "ckpt_00000008.pt"]

    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    (resumed / "checkpoints" / "ckpt_00000008.pt").unlink()  # as if killed before step 8 was saved
    run_train(resumed, *SMALL, "train.max_iters=8", "train.eval_interval=4", "train.checkpoint_interval=4",
              "train.resume=true")
    resumed_records = metrics(resumed)
    assert train_losses(resumed_records) == train_losses(records)  # bitwise: same batches, same RNG, same state
    training_log = [r["step"] for r in records if not LAUNCH_KEYS & r.keys()]
    assert [r["step"] for r in resumed_records if not LAUNCH_KEYS & r.keys()] == training_log  # no duplicated lines
    assert [r["step"] for r in resumed_records if "data" in r] == [0, 4]  # each launch records what it read
    launches = [r["launch"] for r in resumed_records if "launch" in r]  # ... and the code it ran
    assert [r["step"] for r in resumed_records if "launch" in r] == [0, 4]
    code = code_version()
    assert {launch["commit"] for launch in launches} == {code["commit"]}
    assert launches[1]["command"][-1] == "train.resume=true" and launches[1]["world_size"] == 1
    if code["diff"]:  # a working tree with uncommitted changes: each launch saved them
        assert (resumed / launches[1]["patch"]).read_bytes() == code["diff"]
    else:
        assert launches[1]["patch"] is None and not (resumed / "code").exists()


@pytest.mark.slow
def test_a_fresh_run_in_a_used_directory_is_refused_unless_overwrite_and_then_keeps_nothing_of_the_old_run(tmp_path):
    run = (*SMALL, "train.max_iters=4", "train.eval_interval=4", "train.checkpoint_interval=2",
           "train.keep_checkpoints=1")
    run_train(tmp_path, *run, "train.max_iters=6")
    first, first_config = metrics(tmp_path), (tmp_path / ".hydra" / "config.yaml").read_text()

    refused = run_train(tmp_path, *run, "optimizer.lr=2e-2", check=False)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "already holds a run" in refused.stderr and "train.overwrite=true" in refused.stderr
    assert metrics(tmp_path) == first  # the old run's log, checkpoint and record of its config are untouched
    assert (tmp_path / ".hydra" / "config.yaml").read_text() == first_config
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["ckpt_00000006.pt"]

    run_train(tmp_path, *run, "optimizer.lr=2e-2", "train.overwrite=true")
    second = metrics(tmp_path)
    assert [r["step"] for r in second if not LAUNCH_KEYS & r.keys()] == [0, 1, 2, 3, 4, 4]  # nothing of the old log
    # The old run's higher-numbered checkpoint is gone: pruning and resume see only the new run.
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["ckpt_00000004.pt"]
    assert "lr: 0.02" in (tmp_path / ".hydra" / "config.yaml").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["optimizer=mars-m", "optimizer=moonlight",
                                       "optimizer=mars-m optimizer.is_approx=false",
                                       "optimizer=mars-m optimizer.memory_efficient=true"])
def test_mars_m_and_moonlight_learn_through_the_same_trainer(tmp_path, optimizer):
    run_train(tmp_path, *SMALL, *optimizer.split(), "train.max_iters=20", "train.eval_interval=20")
    val = [r["val/loss"] for r in metrics(tmp_path) if "val/loss" in r]
    assert val[-1] < val[0] - 1.5, val


@pytest.mark.slow
def test_issue_command_writes_falling_val_loss(tmp_path):
    run_train(tmp_path, "model=tiny", "data=embedded", "train.max_iters=20", "train.eval_interval=20",
              "train.batch_size=4", "wandb.mode=disabled")
    val = [r["val/loss"] for r in metrics(tmp_path) if "val/loss" in r]
    assert len(val) >= 2 and val[-1] < val[0] - 1.0
    record = next(r for r in metrics(tmp_path) if "train/loss" in r)
    assert {"step", "tokens", "lr", "train/loss", "grad_norm", "tokens_per_s"} <= record.keys()


@pytest.mark.slow
def test_divergence_stops_with_the_step_and_last_checkpoint(tmp_path):
    result = run_train(tmp_path, *SMALL, "train.max_iters=20", "optimizer.lr=1e30", "train.min_lr=0",
                       "train.warmup_iters=0", check=False)
    assert result.returncode != 0
    assert "non-finite" in result.stderr and "at step" in result.stderr and "checkpoint" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_skipped_non_finite_steps_are_counted_in_the_log_before_the_run_stops(tmp_path):
    result = run_train(tmp_path, *SMALL, "train.max_iters=20", "optimizer.lr=1e30", "train.min_lr=0",
                       "train.warmup_iters=0", "train.max_skipped_steps=2", check=False)
    assert result.returncode != 0
    assert "after skipping 2 such step(s)" in result.stderr
    assert [r["skipped_steps"] for r in metrics(tmp_path) if "skipped_steps" in r] == [1, 2]


@pytest.mark.slow
def test_hellaswag_is_scored_periodically_when_asked(tmp_path):
    items = REPO / "tests" / "evaluation" / "hellaswag_sample.jsonl"
    run_train(tmp_path, *SMALL, "train.max_iters=3", "train.eval_interval=3", "train.hellaswag_interval=2",
              f"train.hellaswag_file={items}")
    scores = [r for r in metrics(tmp_path) if "hellaswag/acc_norm" in r]
    assert [r["step"] for r in scores] == [2, 3]  # every 2 steps, and at the end
    for r in scores:  # three items: a fraction in thirds
        assert {round(3 * r["hellaswag/acc"], 6), round(3 * r["hellaswag/acc_norm"], 6)} <= {0, 1, 2, 3}
    missing = run_train(tmp_path / "missing", *SMALL, "train.hellaswag_interval=2",
                        f"train.hellaswag_file={tmp_path / 'nowhere.jsonl'}", check=False)
    assert missing.returncode != 0 and "--download" in missing.stderr and "Traceback" not in missing.stderr


@pytest.mark.slow
def test_bad_value_stops_at_start_with_one_message(tmp_path):
    result = run_train(tmp_path, "train.batch_size=0", check=False)
    assert result.returncode != 0
    assert "train.batch_size must be a positive integer" in result.stderr
    assert "Traceback" not in result.stderr
    # A CUDA device asked for where there is none: the advice in one line, not a traceback.
    result = run_train(tmp_path, "train.device=cuda", check=False)
    assert result.returncode != 0 and "use train.device=cpu or auto" in result.stderr
    assert "Traceback" not in result.stderr
    # Hydra's own hint after the typo `optimizer.gama=0.1` is `+optimizer.gama=0.1`: that must not train either.
    result = run_train(tmp_path, "+optimizer.gama=0.1", check=False)
    assert result.returncode != 0 and "did you mean optimizer.gamma?" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_data_dir_without_data_custom_is_read_as_custom_and_labelled_by_its_directory(tmp_path):
    shards = prepare_embedded()  # any shard directory: the one the embedded corpus is built into will do
    result = run_train(tmp_path / "run", *SMALL, f"data.dir={shards}", "train.max_iters=2", "train.eval_interval=2")
    assert "data custom: train" in result.stdout and "data embedded" not in result.stdout, result.stdout
    table = warm_python.run([sys.executable, "-m", "scripts.make_table", str(tmp_path / "run")], cwd=REPO,
                            timeout=300)
    assert table.returncode == 0, table.stderr
    assert f"| custom-{shards.name} | 2x64 |" in table.stdout and "Shakespeare" not in table.stdout, table.stdout


@pytest.mark.slow
def test_trains_sequentially_from_a_directory_prepared_from_local_files(tmp_path):
    corpus = tmp_path / "plays.jsonl"
    corpus.write_text("".join(json.dumps({"text": clean_play(p.read_text())}) + "\n" for p in play_files()[:3]))
    shards = tmp_path / "shards"
    warm_python.run([sys.executable, "-m", "data.prepare", "files", str(corpus), "--out", str(shards),
                     "--shard-size", "50000", "--val-tokens", "20000", "--workers", "2"],
                    cwd=REPO, check=True, timeout=600)
    run_train(tmp_path / "run", *SMALL, "data=custom", f"data.dir={shards}", "data.sampling=sequential",
              "train.max_iters=5", "train.eval_interval=5")
    records = metrics(tmp_path / "run")
    assert [r["step"] for r in records if "val/loss" in r] == [0, 5]
    manifest = json.loads((shards / "manifest.json").read_text())
    prepared = {split: sum(shard["tokens"] for shard in manifest["shards"] if shard["split"] == split)
                for split in ("train", "val")}
    [launch] = [r for r in records if "data" in r]
    assert {split: read["tokens"] for split, read in launch["data"].items()} == prepared
    assert launch["data"]["train"]["source"] == "1 local file" and launch["data"]["train"]["shards"] > 1


@pytest.mark.slow
def test_wandb_offline_run_records_the_curves_and_its_id_in_the_checkpoint(tmp_path):
    run_train(tmp_path, *SMALL, "train.max_iters=4", "train.eval_interval=2", "wandb.mode=offline")
    run_files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    history = run_files[0].read_bytes()  # wandb's protobuf records keep metric names as plain strings
    assert b"val/loss" in history and b"train/loss" in history
    assert b"data_read" in history and b"shakespeare-v2" in history  # the corpus it read, in the run's config
    checkpoint = torch.load(tmp_path / "checkpoints" / "ckpt_00000004.pt", weights_only=True)
    assert run_files[0].name == f"run-{checkpoint['wandb_run_id']}.wandb"  # a resume continues this run


@pytest.mark.slow
def test_resuming_a_finished_run_says_so_and_a_longer_run_says_its_schedule_stretches(tmp_path):
    run = (*SMALL, "train.eval_interval=4", "train.checkpoint_interval=4")
    run_train(tmp_path, *run, "train.max_iters=4")
    finished = run_train(tmp_path, *run, "train.max_iters=4", "train.resume=true")
    assert "already at train.max_iters=4: nothing to do" in finished.stdout
    longer = run_train(tmp_path, *run, "train.max_iters=8", "train.resume=true")
    assert "the lr schedule now reaches train.min_lr at step 8 instead of the checkpoint's 4" in longer.stdout
    assert "nothing to do" not in longer.stdout
    assert [r["step"] for r in metrics(tmp_path) if "val/loss" in r] == [0, 4, 8]


@pytest.mark.slow
def test_a_compiled_run_follows_the_eager_run(tmp_path):
    # reduce-overhead: the mode reaches torch.compile (on a CPU it compiles as the default mode: CUDA graphs are
    # for CUDA tensors only).
    run = (*SMALL, "train.max_iters=3", "train.eval_interval=3")
    run_train(tmp_path / "eager", *run)
    compiled_run = run_train(tmp_path / "compiled", *run, "train.compile=true", "train.compile_mode=reduce-overhead")
    assert "torch.compile (mode reduce-overhead" in compiled_run.stdout + compiled_run.stderr
    eager, compiled = metrics(tmp_path / "eager"), metrics(tmp_path / "compiled")
    assert [r["step"] for r in compiled] == [r["step"] for r in eager]
    for key in ("train/loss", "val/loss", "grad_norm"):  # fused kernels round differently: not bit for bit
        expected = [r[key] for r in eager if key in r]
        assert expected and [r[key] for r in compiled if key in r] == pytest.approx(expected, rel=1e-5), key


# llama-tiny in miniature: the LLaMA-on-C4 comparison of AdamW, MARS-approx and Muon, on the embedded corpus.
LLAMA_MINIATURE = ["model=llama-tiny", "model.n_layer=2", "model.n_embd=64", "model.intermediate_size=176",
                   *SMALL[3:], "train.max_iters=20", "train.eval_interval=20"]


@pytest.mark.slow
def test_the_llama_miniature_sweep_of_adamw_mars_and_muon_learns_and_tabulates_by_optimizer(tmp_path):
    sweep = tmp_path / "sweep"
    result = warm_python.run([sys.executable, "train.py", "-m", *LLAMA_MINIATURE, "optimizer=adamw,mars-adamw,muon",
                              f"hydra.sweep.dir={sweep}"], cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr
    for point in sorted(sweep.glob("[0-9]_*")):
        val = [r["val/loss"] for r in metrics(point) if "val/loss" in r]
        assert val[-1] < val[0] - 0.3, (point.name, val)
    table = warm_python.run([sys.executable, "-m", "scripts.make_table", str(sweep)], cwd=REPO, timeout=300)
    assert table.returncode == 0, table.stderr
    rows = [line for line in (sweep / "val_loss_table.md").read_text().splitlines() if "| llama-2x64 |" in line]
    assert sorted(row.split(" | ")[3] for row in rows) == ["AdamW", "MARS-approx", "Muon"]
