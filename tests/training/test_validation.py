"""Validation by the paper's procedure (new windows at every evaluation) or on fixed windows, in real runs."""
import pytest

from configs.compose import validate
from configs.schema import ConfigError
from tests.configs.test_experiments import load
from tests.test_train import SMALL, metrics, run_train

EVALUATED = [*SMALL, "train.max_iters=6", "train.eval_interval=2", "train.checkpoint_interval=3"]


def evaluations(run_dir):
    return {r["step"]: r for r in metrics(run_dir) if "val/loss" in r}


@pytest.mark.slow
def test_fresh_windows_are_new_at_every_evaluation_and_the_fixed_ones_are_scored_beside_them(tmp_path):
    run_train(tmp_path / "fixed", *EVALUATED)
    run_train(tmp_path / "fresh", *EVALUATED, "train.eval_sampling=fresh")
    fixed, fresh = evaluations(tmp_path / "fixed"), evaluations(tmp_path / "fresh")
    assert sorted(fresh) == sorted(fixed) == [0, 2, 4, 6]
    # Scoring more windows changes nothing in training: the fixed figure is that of the fixed-window run.
    assert [fresh[s]["val/loss_fixed"] for s in fresh] == [fixed[s]["val/loss"] for s in fixed]
    assert all("val/loss_fixed" not in record for record in fixed.values())
    # Step 0 draws the fixed windows; every later evaluation other ones.
    assert fresh[0]["val/loss"] == fresh[0]["val/loss_fixed"]
    assert all(fresh[s]["val/loss"] != fresh[s]["val/loss_fixed"] for s in (2, 4, 6))
    procedures = [r["evaluation"]["sampling"] for run in ("fixed", "fresh") for r in metrics(tmp_path / run)
                  if "evaluation" in r]
    assert procedures == ["fixed", "fresh"]


@pytest.mark.slow
def test_a_resumed_run_scores_the_fresh_windows_of_the_uninterrupted_one(tmp_path):
    # A constant lr, so that stopping at step 3 leaves the steps after it as they were.
    fresh = [*EVALUATED, "train.eval_sampling=fresh", "train.lr_schedule=constant"]
    run_train(tmp_path / "whole", *fresh)
    run_train(tmp_path / "resumed", *fresh, "train.max_iters=3")
    run_train(tmp_path / "resumed", *fresh, "train.resume=true")
    whole, resumed = evaluations(tmp_path / "whole"), evaluations(tmp_path / "resumed")
    assert [resumed[step]["val/loss"] for step in (4, 6)] == [whole[step]["val/loss"] for step in (4, 6)]


def test_fresh_windows_with_sequential_batches_are_refused_naming_both_keys():
    cfg = load("train.eval_sampling=fresh", "data.sampling=sequential")
    with pytest.raises(ConfigError, match="train.eval_sampling=fresh .* data.sampling=sequential"):
        validate(cfg)


def test_the_default_scores_fixed_windows_and_the_paper_presets_fresh_ones():
    assert load().train.eval_sampling.value == "fixed"
    assert load("experiment=owt-gpt2-small-5b-adamw").train.eval_sampling.value == "fresh"


def test_the_authors_draws_with_fixed_windows_are_refused_naming_both_keys():
    with pytest.raises(ConfigError, match="data.draws=authors .* set train.eval_sampling=fresh"):
        validate(load("data.draws=authors"))


def test_the_default_draws_keyed_windows_and_the_paper_presets_the_authors_ones():
    assert load().data.draws.value == "keyed"
    assert load("experiment=fwe-gpt2-small-50b-mars-approx").data.draws.value == "authors"


@pytest.mark.slow
def test_an_evaluation_their_loop_does_not_make_leaves_the_authors_draws_of_the_steps_after_it(tmp_path):
    # Stopped at step 3, off the eval_interval grid of 2, the run evaluates there; their loop would not, so the
    # resumed run must still train and evaluate on the windows of the run that never stopped.
    authors = [*EVALUATED, "data.draws=authors", "train.eval_sampling=fresh", "train.lr_schedule=constant"]
    run_train(tmp_path / "whole", *authors)
    run_train(tmp_path / "resumed", *authors, "train.max_iters=3")
    run_train(tmp_path / "resumed", *authors, "train.resume=true")
    assert 3 in evaluations(tmp_path / "resumed") and 3 not in evaluations(tmp_path / "whole")
    assert losses_after(metrics(tmp_path / "resumed"), 3) == losses_after(metrics(tmp_path / "whole"), 3)


def losses_after(records, step) -> list[dict]:
    """The losses of every step and evaluation past ``step``, in the order logged."""
    losses = [{key: value for key, value in r.items() if "loss" in key} for r in records if r["step"] > step]
    return [record for record in losses if record]
