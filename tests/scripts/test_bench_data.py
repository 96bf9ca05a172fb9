"""scripts.bench_data on a small load: a loader row per sampling mode, a prepare row per worker count, the files."""
import json
import os
import sys

from configs.schema import Sampling
from scripts import bench_data


def test_writes_a_loader_row_per_sampling_mode_and_a_prepare_row_per_worker_count(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_data", "--tokens", "20000", "--shards", "2", "--batch-size", "2",
                                      "--block-size", "16", "--batches", "5", "--rounds", "1", "--copies", "1",
                                      "--output-dir", str(tmp_path)])
    bench_data.main()
    record = json.loads((tmp_path / "bench_data_cpu.json").read_text())
    assert [row.split(" | ")[0].strip("| ") for row in record["loader"]] == [s.value for s in Sampling]
    assert [int(row.split(" | ")[0].strip("| ")) for row in record["prepare"]] == sorted({1, os.cpu_count() or 1})
    prepared_tokens = {row.split(" | ")[1] for row in record["prepare"]}
    assert len(prepared_tokens) == 1  # every worker count prepares the same tokens
    table = (tmp_path / "bench_data_cpu.md").read_text()
    assert "## Loader (20,000 synthetic tokens in 2 page-cached shards" in table and "## `data.prepare`" in table
