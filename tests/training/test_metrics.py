"""The console line of a metrics record (the numbers a person watches, the ETA in hours/minutes/seconds), and
the log's rewrite on a resume."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from configs.schema import WandbMode
from training.metrics import (METRICS_FILE, MetricsLogger, MetricsWriteError, format_duration, format_record,
                              read_metrics)

REPO = Path(__file__).resolve().parents[2]


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


WANDB_DIES_UNDER_THE_RUN = """
import os, signal, sys
from pathlib import Path
from types import SimpleNamespace
from configs.schema import WandbMode
from training.metrics import MetricsLogger

run_dir = Path(sys.argv[1])
logger = MetricsLogger(run_dir, SimpleNamespace(mode=WandbMode.offline, project="p", entity=None, init_timeout_s=60),
                       {}, "run")
logger.log({"step": 1, "train/loss": 3.0})
# wandb's service process, which this process started: it dies (killed, out of memory) while the run trains.
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\\0")
    except OSError:
        continue
    if command[0].endswith(b"wandb-core") and str(os.getpid()).encode() in command:
        os.kill(int(pid), signal.SIGKILL)
        os.waitpid(int(pid), 0)
logger.log({"step": 2, "train/loss": 2.0})
logger.log({"step": 3, "train/loss": 1.0})
logger.close()
print("trained on")
"""


@pytest.mark.slow
def test_a_wandb_that_dies_under_the_run_is_let_go_with_one_warning_and_the_log_keeps_every_step(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
           "WANDB_MODE": "offline"}
    result = subprocess.run([sys.executable, "-c", WANDB_DIES_UNDER_THE_RUN, str(tmp_path)], capture_output=True,
                            text=True, timeout=300, env=env, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip().endswith("trained on"), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("wandb failed at step 2 (") == 1, result.stderr
    assert "the run goes on without it, every record in" in result.stderr
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
