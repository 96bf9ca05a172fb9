"""The console line of a metrics record: the numbers a person watches, the ETA in hours/minutes/seconds."""
import pytest

from training.metrics import format_duration, format_record


@pytest.mark.parametrize("seconds, text", [(5.6, "6s"), (245, "4m05s"), (3723, "1h02m03s"), (0, "0s")])
def test_durations_read_like_a_clock(seconds, text):
    assert format_duration(seconds) == text


def test_a_training_line_shows_loss_throughput_and_eta_and_skips_what_is_absent():
    line = format_record({"step": 40, "train/loss": 6.25, "tokens": 40960, "tokens_per_s": 856.2, "eta_s": 251.0,
                          "mfu": None})
    assert line == "step 40 | train/loss 6.2500 | tokens 40,960 | tokens_per_s 856 | eta 4m11s"
