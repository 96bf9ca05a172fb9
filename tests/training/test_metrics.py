"""The console line of a metrics record (the numbers a person watches, the ETA in hours/minutes/seconds), and
the log's rewrite on a resume."""
import json
from types import SimpleNamespace

import pytest

from configs.schema import WandbMode
from training.metrics import (METRICS_FILE, MetricsLogger, MetricsWriteError, format_duration, format_record,
                              read_metrics)


@pytest.mark.parametrize("seconds, text", [(5.6, "6s"), (245, "4m05s"), (3723, "1h02m03s"), (0, "0s")])
def test_durations_read_like_a_clock(seconds, text):
    assert format_duration(seconds) == text


def test_a_training_line_shows_loss_throughput_and_eta_and_skips_what_is_absent():
    line = format_record({"step": 40, "train/loss": 6.25, "tokens": 40960, "tokens_per_s": 856.2, "eta_s": 251.0,
                          "mfu": None})
    assert line == "step 40 | train/loss 6.2500 | tokens 40,960 | tokens_per_s 856 | eta 4m11s"


def _logger_with(tmp_path, records):
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    return MetricsLogger(tmp_path, SimpleNamespace(mode=WandbMode.disabled), {}, "run")


def test_discard_after_keeps_the_records_up_to_the_step_and_drops_an_abandoned_launch_from_it(tmp_path):
    data = {"train": {"tokens": 100, "shards": 1, "source": None}}
    records = [{"step": 0, "data": data}, {"step": 0, "val/loss": 10.0},
               {"step": 5, "resumed_from": "ckpt_5", "changed": {"train.seed": [1, 2]}}, {"step": 5, "data": data},
               {"step": 10, "train/loss": 4.0}, {"step": 10, "val/loss": 4.5},
               {"step": 10, "resumed_from": "ckpt_10", "changed": {"optimizer.lr": [0.003, 0.01]}},
               {"step": 10, "data": data}, {"step": 11, "train/loss": 3.9}]
    _logger_with(tmp_path, records).discard_after(10)
    assert read_metrics(tmp_path) == records[:6]


def test_a_failure_while_the_log_is_rewritten_leaves_the_old_log_whole(tmp_path, monkeypatch):
    records = [{"step": step, "train/loss": 1.0} for step in range(5)]
    logger = _logger_with(tmp_path, records)
    calls = []

    def dies_on_the_third_record(record):
        calls.append(record)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed mid-rewrite")
        return json.JSONEncoder().encode(record)

    monkeypatch.setattr(json, "dumps", dies_on_the_third_record)
    with pytest.raises(KeyboardInterrupt):
        logger.discard_after(3)
    monkeypatch.undo()
    assert read_metrics(tmp_path) == records


def test_a_full_disk_under_the_log_is_one_message_naming_it(tmp_path):
    logger = _logger_with(tmp_path, [])
    logger.path.unlink()
    logger.path.symlink_to("/dev/full")  # every write to it fails with ENOSPC, as on a full disk
    with pytest.raises(MetricsWriteError, match=r"could not append to .*metrics\.jsonl \(No space left on device\): "
                                                r"free space .* train\.resume=true"):
        logger.log({"step": 1, "train/loss": 1.0})


def test_undecodable_and_foreign_lines_of_the_log_are_skipped_and_the_rest_read(tmp_path):
    good = [{"step": 0, "val/loss": 10.0}, {"step": 1, "train/loss": 9.0}]
    (tmp_path / METRICS_FILE).write_bytes(json.dumps(good[0]).encode() + b"\n\xff\xfe\x00garbage\n5\n{}\n"
                                          + json.dumps(good[1]).encode() + b"\n")
    assert read_metrics(tmp_path) == good
