"""scripts.eval_sampling_gap's figures, read off evaluation records as train.py logs them under fresh windows."""
from scripts.eval_sampling_gap import gap_table, seed_figures

EVALUATIONS = [{"step": 0, "val/loss": 10.8, "val/loss_fixed": 10.8},
               {"step": 10, "val/loss": 6.9, "val/loss_fixed": 7.0},
               {"step": 20, "val/loss": 6.6, "val/loss_fixed": 6.8}]


def test_each_seed_gives_both_bests_and_the_fixed_windows_offset_without_step_0():
    fresh, fixed, offset = seed_figures(EVALUATIONS)
    assert (fresh, fixed) == (6.6, 6.8)
    assert abs(offset - (-0.1 + -0.2) / 2) < 1e-12


def test_the_table_has_a_row_per_seed_and_their_mean_with_its_spread():
    table = gap_table({1: (6.6, 6.8, -0.15), 2: (6.7, 6.75, -0.05)})
    assert table[2] == "| 1 | 6.6000 | 6.8000 | -0.2000 | -0.1500 |"
    assert table[-1] == "| mean | | | -0.1250 (sd 0.1061) | -0.1000 (sd 0.0707) |"
