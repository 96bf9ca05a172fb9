"""DivergenceGuard: finite steps pass, non-finite ones are skipped up to the limit (the optimizer's state left as it
was), then the run stops naming what is not finite."""
import contextlib
import copy
import functools
import itertools
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from configs.compose import CONFIG_DIR, compose_config
from configs.registry import OPTIMIZERS, optimizer_entry
from data.loader import TokenBatches
from model import GPT, GPTConfig
from tests import warm_python
from tests.training.nan_batch_train import poisoned_forward
from train import compute_gradients
from training.divergence import DivergenceGuard, TrainingDiverged, ValLossWatch, non_finite_entries, skip_update
from training.metrics import read_metrics
from training.optimizers import build_optimizer, local_optimizer, optimizer_class_and_arguments

REPO = Path(__file__).resolve().parents[2]
SMALL = ["model.n_layer=1", "model.n_head=2", "model.n_embd=32", "train.batch_size=2", "train.block_size=16",
         "train.eval_iters=1", "train.warmup_iters=1", "train.device=cpu"]


def test_finite_steps_are_applied_and_not_counted():
    guard = DivergenceGuard(max_skipped_steps=1)
    assert all(guard.allows_update(step, 3.0, 1.5, lookahead_grad_norm=0.7) for step in range(1, 5))
    assert guard.skipped_steps == 0


@pytest.mark.parametrize("loss, grad_norm, lookahead", [(math.nan, 1.0, 0.0), (2.0, math.inf, 0.0),
                                                        (2.0, 1.0, math.nan)])
def test_without_skips_the_first_non_finite_step_stops_naming_step_and_checkpoint(loss, grad_norm, lookahead):
    with pytest.raises(TrainingDiverged, match=r"^diverged at step 7: non-finite .*; last good checkpoint: ckpt_5.pt"):
        DivergenceGuard().allows_update(7, loss, grad_norm, "ckpt_5.pt", lookahead)


def test_skips_up_to_the_limit_then_stops_and_the_count_survives_a_resume():
    guard = DivergenceGuard(max_skipped_steps=2)
    assert not guard.allows_update(3, math.nan, math.nan)
    assert guard.allows_update(4, 2.0, 1.0)
    assert not guard.allows_update(5, 2.0, math.inf)
    assert guard.skipped_steps == 2
    resumed = DivergenceGuard(max_skipped_steps=2, skipped_steps=guard.skipped_steps)
    with pytest.raises(TrainingDiverged, match="at step 9: .* after skipping 2 such step"):
        resumed.allows_update(9, math.nan, 1.0)


def test_non_finite_entries_name_the_model_and_optimizer_tensors_holding_nan_or_inf():
    model_state = {"wte.weight": torch.ones(3), "ln.weight": torch.tensor([1.0, float("nan")])}
    optimizer_state = {"state": {0: {"step": torch.tensor(3), "exp_avg": torch.zeros(2),
                                     "exp_avg_sq": torch.tensor([float("inf"), 0.0], dtype=torch.bfloat16)}},
                       "param_groups": [{"lr": float("inf")}]}  # hyperparameters are not state
    assert non_finite_entries(model_state, optimizer_state) == ["model ln.weight",
                                                                "optimizer exp_avg_sq of parameter 0"]
    assert non_finite_entries({"w": torch.ones(2)}, {"state": {0: {"step": 1}}}) == []


def test_a_val_loss_above_the_step_0_one_stops_the_run_naming_one_step_and_the_reason_alone():
    watch = ValLossWatch(ratio=1.0, stop=True, advice="Lower optimizer.lr.")
    watch.check(0, 10.82)
    watch.check(2, 7.5, "ckpt_2.pt")  # below the untrained model's: healthy
    with pytest.raises(TrainingDiverged) as stopped:
        watch.check(4, 981.0, "ckpt_2.pt")
    reason = "val loss 981, above 1 x the step-0 val loss 10.82 (train.diverged_val_loss_ratio)"
    assert (stopped.value.reason, stopped.value.step) == (reason, 4)
    assert str(stopped.value) == f"diverged at step 4: {reason}; last good checkpoint: ckpt_2.pt. Lower optimizer.lr."


def test_a_run_told_to_train_on_past_its_blow_up_is_marked_diverged_at_its_end_at_the_step_it_blew_up():
    watch = ValLossWatch(ratio=2.0, stop=False, advice="", initial_val_loss=10.0)  # resumed: step 0 from the log
    watch.check(2, 19.0)  # within 2 x
    watch.check(4, 25.0)
    watch.check(6, 30.0)
    with pytest.raises(TrainingDiverged, match=r"^diverged at step 4: val loss 25, above 2 x the step-0 val loss 10 "):
        watch.raise_if_diverged("ckpt_6.pt")


def test_a_non_finite_val_loss_is_told_as_such_not_as_a_ratio():
    watch = ValLossWatch(ratio=1.0, stop=True, advice="", initial_val_loss=10.8)
    with pytest.raises(TrainingDiverged) as stopped:
        watch.check(2, math.nan)
    assert (stopped.value.reason, stopped.value.step) == ("non-finite val loss nan", 2)


@pytest.mark.parametrize("loss, grad_norm, lookahead, reason", [
    (5150.955078125, math.inf, 0.0, "non-finite gradient norm inf (training loss 5150.9551)"),
    (math.nan, 1.545468807220459, 0.0, "non-finite training loss nan (gradient norm 1.545)"),
    (math.nan, math.nan, 0.0, "non-finite training loss nan and gradient norm nan"),
    (10.848800659179688, 1.545468807220459, math.nan,
     "non-finite look-ahead gradient norm nan (training loss 10.8488, gradient norm 1.545)"),
], ids=["gradient-norm", "loss", "both", "look-ahead"])
def test_a_non_finite_step_names_exactly_what_is_not_finite_rounded_as_the_log_rounds(loss, grad_norm, lookahead,
                                                                                      reason, caplog):
    guard = DivergenceGuard(max_skipped_steps=1)
    assert not guard.allows_update(22, loss, grad_norm, lookahead_grad_norm=lookahead)
    assert caplog.messages == [f"{reason} at step 22: update skipped (1 of train.max_skipped_steps=1)"]
    with pytest.raises(TrainingDiverged) as stopped:
        guard.allows_update(23, loss, grad_norm, "ckpt_20.pt", lookahead)
    assert stopped.value.reason == f"{reason} after skipping 1 such step(s)"
    assert str(stopped.value).startswith(f"diverged at step 23: {reason} after skipping 1 such step(s); ")


@functools.cache
def optimizer_config(name: str):
    return compose_config([f"optimizer={name}"]).optimizer


def registered_variants(name: str) -> dict[str, DictConfig]:
    """The optimizer config ``name`` of configs/optimizer/ with every combination of its boolean keys that change
    its state's layout or meaning, as the registry names them (``state_keys``: the MARS scheme, amsgrad, MARS-M's
    memory-efficient variant, ...), but those the registry refuses; by their settings."""
    cfg = optimizer_config(name)
    keys = [key for key in optimizer_entry(cfg.name).state_keys if isinstance(cfg.get(key), bool)]
    variants = {}
    for values in itertools.product((False, True), repeat=len(keys)):
        variant = OmegaConf.merge(cfg, dict(zip(keys, values)))
        try:
            optimizer_class_and_arguments(variant)
        except ValueError:  # a combination the registry refuses (MARS-M's memory-efficient exact scheme)
            continue
        variants[",".join(f"{key}={value}" for key, value in zip(keys, values)) or "default"] = variant
    return variants


OPTIMIZER_CONFIGS = sorted(path.stem for path in (CONFIG_DIR / "optimizer").glob("*.yaml"))


def test_the_variants_cover_every_optimizer_and_scheme_the_registry_labels():
    # (optimizer=external's label is its class's name: no fixed labels to cover.)
    labelled = {optimizer_entry(cfg.name).label(cfg) for name in OPTIMIZER_CONFIGS
                for cfg in registered_variants(name).values() if optimizer_entry(cfg.name).labels}
    assert labelled == {label for entry in OPTIMIZERS.values() for label in entry.labels}


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64, bias=True))


def state_tensors(optimizer) -> dict:
    """Every tensor and value of the optimizer's state, copied: ``(parameter index, key) -> value``."""
    states = local_optimizer(optimizer).state_dict()["state"]
    return {(index, key): copy.deepcopy(value) for index, state in states.items() for key, value in state.items()}


def assert_same_state(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert (torch.equal(actual[key], value) if torch.is_tensor(value) else actual[key] == value), key


@pytest.mark.parametrize("name", OPTIMIZER_CONFIGS)
def test_a_skipped_step_leaves_the_optimizers_state_as_it_was_whatever_the_optimizer_and_step(name, monkeypatch):
    """For each variant, a NaN micro-batch at the first step (no state yet) and at a later one; in exact MARS the
    look-ahead micro-batch (the first of the step) or the step's own. The loop's calls: train.compute_gradients,
    the guard, skip_update."""
    t = SimpleNamespace(batch_size=2, block_size=8, grad_accum_steps=1, grad_multiplier=1.0, grad_clip=1.0)
    batches = TokenBatches(np.arange(512) % 64, "train", batch_size=2, block_size=8, seed=0, sampling="sequential",
                           vocab_size=64)
    forward = GPT.forward
    for variant, cfg in registered_variants(name).items():
        for skipped_step, poisoned_pass in ((0, 1), (0, 2), (2, 1), (2, 2)):
            model = tiny_gpt()
            optimizer = build_optimizer(cfg, model)
            lookahead = getattr(local_optimizer(optimizer), "needs_lookahead_grad", False)
            passes_a_step = 2 if lookahead else 1
            if poisoned_pass > passes_a_step:
                continue
            monkeypatch.setattr(GPT, "forward", poisoned_forward(forward, skipped_step * passes_a_step + poisoned_pass))
            guard = DivergenceGuard(max_skipped_steps=1)
            for step in range(skipped_step + 2):
                before = state_tensors(optimizer)
                scalars = compute_gradients(model, model, optimizer, batches, step, t, contextlib.nullcontext(),
                                            lookahead)
                if guard.allows_update(step + 1, *(float(scalar) for scalar in scalars[:2]),
                                       lookahead_grad_norm=float(scalars[2])):
                    optimizer.step()
                else:
                    skip_update(optimizer)
                    assert step == skipped_step
                    assert_same_state(state_tensors(optimizer), before)
                optimizer.zero_grad(set_to_none=True)
            assert guard.skipped_steps == 1, (variant, skipped_step, poisoned_pass)
            assert not non_finite_entries(model.state_dict(), local_optimizer(optimizer).state_dict()), variant


def test_a_skipped_exact_mars_step_that_falls_on_a_checkpoint_step_is_checkpointed_and_the_run_trains_on(tmp_path):
    # The 3rd training forward pass: the look-ahead micro-batch of step 2, a checkpoint step.
    result = warm_python.run([sys.executable, "-m", "tests.training.nan_batch_train", "3", f"hydra.run.dir={tmp_path}",
                              *SMALL, "optimizer=mars-adamw", "optimizer.is_approx=false", "train.max_iters=4",
                              "train.checkpoint_interval=2", "train.eval_interval=4", "train.log_interval=1",
                              "train.max_skipped_steps=1"], cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "non-finite look-ahead gradient norm nan (training loss " in result.stdout + result.stderr, result.stdout
    assert [r.get("skipped_steps", 0) for r in read_metrics(tmp_path) if "train/loss" in r] == [0, 1, 1, 1]
    saved = torch.load(tmp_path / "checkpoints" / "ckpt_00000002.pt", weights_only=False)
    assert not non_finite_entries(saved["model"], saved["optimizer"])
    # As step 1 left it: the look-ahead gradient remembered for step 2 is the one stashed at step 1.
    assert all(torch.equal(state["previous_grad"], state["last_grad"])
               for state in saved["optimizer"]["state"].values() if "last_grad" in state)
