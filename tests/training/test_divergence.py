"""DivergenceGuard: finite steps pass, non-finite ones are skipped up to the limit, then the run stops."""
import math

import pytest
import torch

from training.divergence import DivergenceGuard, TrainingDiverged, ValLossWatch, non_finite_entries


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
