"""Labelling runs read back from their directories: model size, optimizer, nominal token budget, seeds."""
import json
from pathlib import Path

import pytest

from reporting.run_labels import corpus_of, display_optimizer, nominal_tokens, tokens_label
from reporting.run_selection import group_settings, load_runs, setting_labels
from training.checkpoint import save_checkpoint


@pytest.mark.parametrize("tokens, label", [(10_000 * 491_520, "5B"), (40_000 * 491_520, "20B"),
                                           (100_000 * 491_520, "50B"), (64, "64"), (1_234_567, "1.23M"),
                                           (4.8e9, "4.8B")])
def test_token_budgets_are_named_as_the_paper_names_them(tokens, label):
    assert tokens_label(tokens) == label


def test_nominal_budget_is_the_round_number_within_two_percent():
    assert nominal_tokens(4.915e9) == 5e9 and nominal_tokens(4.8e9) == 4.8e9


def test_runs_are_labelled_from_their_config_and_log(paper_runs):
    runs = {run.name.rsplit("/", 1)[-1]: run for run in load_runs([str(paper_runs)])}
    assert sorted(runs) == ["adamw-seed1", "adamw-seed2", "mars-gamma0.025", "mars-gamma0.05"]
    mars = runs["mars-gamma0.05"]
    assert (mars.corpus, mars.model, mars.optimizer, mars.gamma, mars.lr) == ("openwebtext", "small", "mars-approx",
                                                                              0.05, 6e-3)
    assert mars.budget == 10_000 * 491_520 and mars.best_val_loss == 3.120
    assert runs["adamw-seed1"].optimizer == "adamw" and runs["adamw-seed1"].gamma is None


def test_seeds_share_a_setting_and_settings_are_ranked_by_mean_best_loss(paper_runs):
    groups = group_settings(load_runs([str(paper_runs)]))
    adamw, = groups["openwebtext", "small", 5e9, "adamw"]
    assert adamw.best_val_losses == [3.201, 3.205]
    mars = groups["openwebtext", "small", 5e9, "mars-approx"]
    assert [setting.first.gamma for setting in mars] == [0.025, 0.05]


def test_a_run_without_a_training_step_is_a_run_stopped_at_step_0_of_its_configured_budget(tmp_path, make_run):
    run_dir = make_run(tmp_path / "fresh", ["train.max_iters=10"], [10.9, 10.8], tokens_per_step=64)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text(lines[0] + "\n")  # only the evaluation at step 0
    run, = load_runs([str(tmp_path)])
    # The tiny config's batch: 8 sequences of 128 tokens, one micro-batch, on one process.
    assert run.budget == 10 * 8 * 128 and run.stopped_early and run.stopped_at == "at step 0 of 10"
    assert run.best_val_loss is None and not run.failed  # step 0 scores the untrained model: no best


def test_a_run_stopped_between_its_log_lines_is_stopped_at_the_step_its_checkpoint_saved(tmp_path, make_run):
    # A stop (Ctrl-C, a preemption) checkpoints the step it finished, past the last one logged: the table says it.
    run_dir = make_run(tmp_path / "stopped", ["train.max_iters=500"], [10.9, 10.8, 10.7], tokens_per_step=64)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    logged = [line for line in lines if json.loads(line)["step"] < 500]  # it stopped before its end
    (run_dir / "metrics.jsonl").write_text("".join(line + "\n" for line in logged))
    stopped = max(json.loads(line)["step"] for line in logged) + 3
    save_checkpoint(run_dir, stopped, {"step": stopped}, keep=2)
    run, = load_runs([str(tmp_path)])
    assert run.stopped_early and run.stopped_at == f"at step {stopped} of 500"


def test_other_model_shapes_and_mars_variants_get_their_own_labels(tmp_path, make_run):
    make_run(tmp_path / "lion", ["optimizer=mars-lion", "optimizer.is_approx=false", "train.max_iters=10"],
             [10.9, 9.0], tokens_per_step=64)
    run, = load_runs([str(tmp_path / "*")])
    assert (run.model, run.optimizer, run.corpus) == ("4x128", "mars-lion-exact", "embedded")


def test_every_mars_variant_has_a_display_name_in_the_paper_style():
    names = [display_optimizer(f"{variant}-{scheme}") for variant in ("mars", "mars-lion", "mars-shampoo")
             for scheme in ("approx", "exact")]
    assert names == ["MARS-approx", "MARS-exact", "MARS-Lion", "MARS-Lion-exact", "MARS-Shampoo",
                     "MARS-Shampoo-exact"]


@pytest.mark.parametrize("key", ["optimizer.ns_dtype", "train.finished_checkpoints", "model.activation"])
def test_a_run_saved_before_a_new_key_is_left_out_and_named_not_pooled(tmp_path, make_run, caplog, key):
    base = ["optimizer=mars-shampoo", "train.max_iters=10"]
    old = make_run(tmp_path / "old", base, [10.8, 6.0], 1024)
    make_run(tmp_path / "new", [*base, "train.seed=2"], [10.8, 6.2], 1024)
    config = old / ".hydra" / "config.yaml"
    name = key.split(".")[1]
    config.write_text("\n".join(line for line in config.read_text().splitlines() if f" {name}:" not in line))
    [settings] = group_settings(load_runs([str(tmp_path)])).values()
    assert [[Path(run.name).name for run in setting.runs] for setting in settings] == [["new"]]
    assert f"{old}: left out, written by an older version of this project (its config has no {key})" in caplog.text


def test_keys_that_change_nothing_do_not_split_a_setting(tmp_path, make_run):
    # MARS-AdamW never runs Newton-Schulz: its ns_dtype (whose default moved from bfloat16 to auto) and ns_form
    # say nothing about the run; a CUDA graph launches the same kernels.
    base = ["optimizer=mars-adamw", "train.max_iters=10"]
    make_run(tmp_path / "old", [*base, "optimizer.ns_dtype=bfloat16"], [10.8, 6.0], 1024)
    make_run(tmp_path / "new", [*base, "train.seed=2", "optimizer.ns_form=fused_gram"], [10.8, 6.2], 1024)
    make_run(tmp_path / "muon", ["optimizer=muon", "train.max_iters=10"], [10.8, 6.0], 1024)
    make_run(tmp_path / "muon-graph", ["optimizer=muon", "train.max_iters=10", "train.seed=2",
                                       "optimizer.ns_cuda_graph=true"], [10.8, 6.1], 1024)
    make_run(tmp_path / "muon-float32", ["optimizer=muon", "train.max_iters=10", "optimizer.ns_dtype=float32"],
             [10.8, 6.1], 1024)
    by_optimizer = {optimizer: sorted(len(setting.runs) for setting in settings)
                    for (_, _, _, optimizer), settings in group_settings(load_runs([str(tmp_path)])).items()}
    assert by_optimizer == {"mars-approx": [2], "muon": [1, 2]}  # Muon's own ns_dtype does split


def test_a_run_resumed_with_changed_settings_is_not_pooled_with_runs_of_its_final_config(tmp_path, make_run):
    base = ["optimizer=mars-adamw", "train.max_iters=10", "optimizer.lr=1e-2"]
    changed = make_run(tmp_path / "changed", base, [10.8, 6.0], 1024)
    make_run(tmp_path / "plain", [*base, "train.seed=2"], [10.8, 6.2], 1024)
    moved = make_run(tmp_path / "moved", [*base, "train.seed=3"], [10.8, 6.3], 1024)
    with open(changed / "metrics.jsonl", "a") as log:  # what train.py records on such a resume
        log.write(json.dumps({"step": 5, "resumed_from": "ckpt", "changed": {"optimizer.lr": [3e-3, 1e-2]}}) + "\n")
    with open(moved / "metrics.jsonl", "a") as log:  # a change that does not alter what the run computes
        log.write(json.dumps({"step": 5, "resumed_from": "ckpt", "changed": {"wandb.mode": ["disabled", "online"],
                                                                             "train.device": ["cpu", "auto"]}}) + "\n")
    [settings] = group_settings(load_runs([str(tmp_path)])).values()
    assert sorted(sorted(Path(run.name).name for run in setting.runs) for setting in settings) == [
        ["changed"], ["moved", "plain"]]


@pytest.mark.parametrize("changed", [{"train.seed": [1337, 3]}, {"data.dir": ["a", "b"]},
                                     {"data.sampling": ["random", "sequential"]},
                                     {"data.name": ["custom", "embedded"]}])
def test_a_run_resumed_with_another_seed_or_data_is_not_an_independent_seed(tmp_path, make_run, changed):
    # It shares its first steps and initial weights with the run it started as: not a seed of its own.
    base = ["optimizer=adamw", "train.max_iters=10"]
    resumed = make_run(tmp_path / "resumed", [*base, "train.seed=3"], [10.8, 6.0], 1024)
    make_run(tmp_path / "plain", [*base, "train.seed=2"], [10.8, 6.2], 1024)
    with open(resumed / "metrics.jsonl", "a") as log:
        log.write(json.dumps({"step": 5, "resumed_from": "ckpt", "changed": changed}) + "\n")
    [settings] = group_settings(load_runs([str(tmp_path)])).values()
    assert sorted(len(setting.runs) for setting in settings) == [1, 1]


def test_custom_corpora_in_other_directories_are_not_seeds_of_each_other_but_a_named_corpus_anywhere_is(
        tmp_path, make_run):
    base = ["optimizer=adamw", "train.max_iters=10"]
    custom = [*base, "data=custom"]
    make_run(tmp_path / "a1", [*custom, "data.dir=/data/a/shards"], [10.8, 6.0], 1024)
    make_run(tmp_path / "a2", [*custom, "data.dir=/data/a/shards/", "train.seed=2"], [10.8, 6.1], 1024)
    make_run(tmp_path / "b", [*custom, "data.dir=/data/b/shards", "train.seed=3"], [10.8, 5.0], 1024)
    make_run(tmp_path / "tokens", [*custom, "data.dir=/data/tokens"], [10.8, 5.5], 1024)
    make_run(tmp_path / "here", [*base, "data=openwebtext", "data.dir=/here"], [10.8, 6.2], 1024)
    make_run(tmp_path / "there", [*base, "data=openwebtext", "data.dir=/there", "train.seed=2"], [10.8, 6.3], 1024)
    groups = group_settings(load_runs([str(tmp_path)]))
    seeds = {corpus: [sorted(Path(run.name).name for run in setting.runs) for setting in settings]
             for (corpus, *_), settings in groups.items()}
    assert seeds == {"custom-a-shards": [["a1", "a2"]], "custom-b-shards": [["b"]], "custom-tokens": [["tokens"]],
                     "openwebtext": [["here", "there"]]}


def record_data_read(run_dir: Path, train_tokens: int, step: int = 0, source: str | None = None) -> None:
    """What train.py logs at each launch: the tokens (and source) of the shards it reads."""
    data = {"train": {"tokens": train_tokens, "shards": 1, "source": source},
            "val": {"tokens": 1000, "shards": 1, "source": source}}
    with open(run_dir / "metrics.jsonl", "a") as log:
        log.write(json.dumps({"step": step, "data": data}) + "\n")


def test_runs_of_one_config_that_read_other_data_are_not_seeds_of_each_other(tmp_path, make_run):
    # fineweb-edu's 10B and 100B samples, each where its machine keeps it: data.dir says nothing, the size does.
    base = ["optimizer=adamw", "train.max_iters=10", "data=fineweb-edu"]
    for name, seed, tokens in (("a1", 1, 10_000), ("a2", 2, 10_000), ("b", 3, 100_000)):
        run = make_run(tmp_path / name, [*base, f"train.seed={seed}", f"data.dir=/{name}"], [10.8, 6.0], 1024)
        record_data_read(run, tokens, source="HuggingFaceFW/fineweb-edu sample-10BT" if tokens == 10_000 else None)
    make_run(tmp_path / "unrecorded", [*base, "train.seed=4"], [10.8, 6.1], 1024)
    [settings] = group_settings(load_runs([str(tmp_path)])).values()
    assert sorted(sorted(Path(run.name).name for run in setting.runs) for setting in settings) == [
        ["a1", "a2"], ["b"], ["unrecorded"]]  # with two sizes read, a run that did not record its own is apart
    assert sorted(setting_labels(settings)) == ["read=100,000 train tokens",
                                                "read=HuggingFaceFW/fineweb-edu sample-10BT, 10,000 train tokens",
                                                "read=not recorded"]


def test_a_run_that_did_not_record_its_data_pools_with_seeds_that_all_read_the_same(tmp_path, make_run):
    base = ["optimizer=adamw", "train.max_iters=10"]
    record_data_read(make_run(tmp_path / "new", base, [10.8, 6.0], 1024), 10_000)
    make_run(tmp_path / "old", [*base, "train.seed=2"], [10.8, 6.1], 1024)
    [[setting]] = group_settings(load_runs([str(tmp_path)])).values()
    assert len(setting.runs) == 2 and setting_labels([setting]) == [""]


def test_a_run_resumed_on_other_shards_is_a_setting_of_its_own(tmp_path, make_run):
    base = ["optimizer=adamw", "train.max_iters=10"]
    for name, seed in (("same", 1), ("resumed", 2), ("reprepared", 3)):
        run = make_run(tmp_path / name, [*base, f"train.seed={seed}"], [10.8, 6.0], 1024)
        record_data_read(run, 10_000)
        record_data_read(run, 10_000 if name != "reprepared" else 12_000, step=5)
    [settings] = group_settings(load_runs([str(tmp_path)])).values()
    assert sorted(sorted(Path(run.name).name for run in setting.runs) for setting in settings) == [
        ["reprepared"], ["resumed", "same"]]


def test_runs_evaluated_otherwise_are_not_seeds_of_each_other(tmp_path, make_run):
    # A best loss over twice as many evaluations, or over fewer batches each, is not the same figure.
    base = ["optimizer=adamw", "train.max_iters=10"]
    make_run(tmp_path / "plain", base, [10.8, 6.0], 1024)
    make_run(tmp_path / "seed2", [*base, "train.seed=2"], [10.8, 6.1], 1024)
    make_run(tmp_path / "denser", [*base, "train.seed=3", "train.eval_interval=5"], [10.8, 6.2], 1024)
    make_run(tmp_path / "fewer", [*base, "train.seed=4", "train.eval_iters=2"], [10.8, 6.3], 1024)
    [settings] = group_settings(load_runs([str(tmp_path)])).values()
    assert sorted(sorted(Path(run.name).name for run in setting.runs) for setting in settings) == [
        ["denser"], ["fewer"], ["plain", "seed2"]]


@pytest.mark.parametrize("command", ["scripts.make_table", "scripts.plot_sweep", "scripts.plot_curves"])
def test_a_glob_that_matches_nothing_is_named_not_taken_for_an_empty_table(tmp_path, command):
    import importlib

    pattern = str(tmp_path / "multirun" / "*" / "*")
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(command).main([pattern, "--out", str(tmp_path / "out")])
    assert exit_info.value.code.startswith(f"error: no run directory matches {pattern}: ")


def test_a_run_recorded_as_data_embedded_with_a_data_dir_is_labelled_by_the_directory_it_read():
    assert corpus_of({"name": "embedded", "dir": "/data/shards/"}) == "custom:/data/shards"
    assert corpus_of({"name": "embedded", "dir": None}) == "embedded"
    assert corpus_of({"name": "openwebtext", "dir": "/data/owt"}) == "openwebtext"
