"""scripts.bench_train on a CPU: one row per optimizer, the phases that optimizer really has, the files."""
import json

import pytest

from configs.compose import compose_config
from scripts import bench_train


@pytest.mark.slow
def test_writes_a_row_per_optimizer_with_its_phases(tmp_path):
    bench_train.main(["--device", "cpu", "--model", "tiny", "--batch-size", "2", "--block-size", "16",
                      "--steps", "2", "--warmup", "1", "--optimizers", "AdamW", "MARS-exact",
                      "--output-dir", str(tmp_path)])
    record = json.loads((tmp_path / "bench_train_cpu.json").read_text())
    rows = {row["label"]: row for row in record["rows"]}
    assert list(rows) == ["AdamW", "MARS-exact"]
    assert rows["AdamW"]["phase_ms"]["look-ahead"] == 0.0  # one gradient per step
    assert rows["MARS-exact"]["phase_ms"]["look-ahead"] > 0.0  # the exact scheme's second gradient
    for row in rows.values():
        assert row["step_ms"] > 0 and row["tokens_per_s"] == 2 * 16 / (row["step_ms"] / 1000)
        assert all(row["phase_ms"][phase] > 0 for phase in ("forward", "backward", "optimizer"))
        assert row["mfu"] is None  # no peak FLOP/s is known for a CPU
    table = (tmp_path / "bench_train_cpu.md").read_text()
    assert "| AdamW | " in table and "| MARS-exact | " in table and "bench_train --device cpu" in table


def test_a_run_stopped_after_its_first_row_keeps_that_row_on_disk(tmp_path, monkeypatch):
    """A GPU round stops each part at its time limit: the rows finished by then must already be written."""
    real_bench = bench_train.bench_optimizer
    calls = []

    def stopped_at_the_second_row(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a time limit's signal ends the run with
        return real_bench(*args, **kwargs)
    monkeypatch.setattr(bench_train, "bench_optimizer", stopped_at_the_second_row)
    with pytest.raises(KeyboardInterrupt):
        bench_train.main(["--device", "cpu", "--model", "tiny", "--batch-size", "2", "--block-size", "16",
                          "--steps", "1", "--warmup", "0", "--optimizers", "AdamW", "MARS-Lion",
                          "--output-dir", str(tmp_path)])
    record = json.loads((tmp_path / "bench_train_cpu.json").read_text())
    assert [row["label"] for row in record["rows"]] == ["AdamW"]
    assert "| AdamW | " in (tmp_path / "bench_train_cpu.md").read_text()


@pytest.mark.slow
def test_loss_chunk_sizes_add_a_row_per_size_beside_the_plain_loss(tmp_path):
    bench_train.main(["--device", "cpu", "--model", "tiny", "--batch-size", "2", "--block-size", "16",
                      "--steps", "1", "--warmup", "0", "--optimizers", "AdamW", "--loss-chunk-sizes", "0", "12",
                      "--output-dir", str(tmp_path), "--tag", "chunks"])
    record = json.loads((tmp_path / "bench_train_cpu_chunks.json").read_text())
    assert [(row["label"], row["loss_chunk_size"]) for row in record["rows"]] == [
        ("AdamW", 0), ("AdamW, loss in chunks of 12", 12)]
    assert record["loss_chunk_sizes"] == [0, 12]
    assert "| AdamW, loss in chunks of 12 | " in (tmp_path / "bench_train_cpu_chunks.md").read_text()


def test_the_cuda_graph_rows_are_left_out_on_a_cpu_and_refused_when_asked_for(tmp_path, monkeypatch, capsys):
    benched = []
    monkeypatch.setattr(bench_train, "bench_optimizer",
                        lambda label, *_: benched.append(label) or {"label": label, "step_ms": 1.0})
    monkeypatch.setattr(bench_train, "markdown_table", lambda rows, device: "")
    bench_train.main(["--device", "cpu", "--output-dir", str(tmp_path)])
    assert bench_train.cuda_only_rows() == {
        "Muon CUDA graph", "Muon fused_gram CUDA graph", "Muon ns_batch CUDA graph",
        "Muon fused_gram ns_batch CUDA graph", "MARS-Shampoo CUDA graph", "MARS-Shampoo ns_batch CUDA graph",
        "MARS-M CUDA graph", "MARS-M ns_batch CUDA graph"}
    assert benched == [label for label in bench_train.benched_configs() if label not in bench_train.cuda_only_rows()]
    with pytest.raises(SystemExit) as exit:
        bench_train.main(["--device", "cpu", "--optimizers", "Muon CUDA graph", "--output-dir", str(tmp_path)])
    assert exit.value.code == 2 and "need a CUDA device" in capsys.readouterr().err


def test_compile_modes_add_a_row_per_mode_and_need_compile(tmp_path, monkeypatch, capsys):
    benched = []
    monkeypatch.setattr(bench_train, "bench_optimizer", lambda label, chunk, args, device, mode: benched.append(
        bench_train.row_label(label, chunk, mode)) or {"label": benched[-1], "step_ms": 1.0})
    monkeypatch.setattr(bench_train, "markdown_table", lambda rows, device: "")
    bench_train.main(["--device", "cpu", "--compile", "--compile-modes", "default", "max-autotune-no-cudagraphs",
                      "--optimizers", "AdamW", "--loss-chunk-sizes", "0", "64", "--output-dir", str(tmp_path)])
    assert benched == ["AdamW", "AdamW, compile mode max-autotune-no-cudagraphs", "AdamW, loss in chunks of 64",
                       "AdamW, loss in chunks of 64, compile mode max-autotune-no-cudagraphs"]
    with pytest.raises(SystemExit):
        bench_train.main(["--device", "cpu", "--compile-modes", "max-autotune", "--output-dir", str(tmp_path)])
    assert "add --compile" in capsys.readouterr().err


@pytest.mark.slow
def test_every_row_is_a_valid_config_of_what_it_names():
    from configs.compose import validate

    for label, overrides in bench_train.benched_configs().items():
        cfg = compose_config(["model=tiny", *overrides])
        validate(cfg)
        assert cfg.optimizer.get("ns_cuda_graph", False) == ("CUDA graph" in label), label
        assert ("fused_gram" in label) == (cfg.optimizer.get("ns_form") == "fused_gram"), label
        assert ("ns_batch" in label) == cfg.optimizer.get("ns_batch", False), label
        assert bench_train.orthogonalises(label) == (
            label.startswith(("Muon", "MARS-Shampoo", "MARS-M", "Moonlight"))), label


def test_every_optimizer_config_has_a_row_named_as_the_registry_labels_it():
    from configs.registry import OPTIMIZERS as REGISTRY

    for path in sorted(bench_train.CONFIG_DIR.glob("optimizer/*.yaml")):
        optimizer_cfg = compose_config([f"optimizer={path.stem}"]).optimizer
        entry = REGISTRY[optimizer_cfg.name]
        label = entry.label(optimizer_cfg)  # optimizer=external's: its class name
        assert bench_train.benched_configs()[entry.labels.get(label, label)] == [f"optimizer={path.stem}"]
