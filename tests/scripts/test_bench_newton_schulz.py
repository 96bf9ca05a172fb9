"""scripts.bench_newton_schulz on small matrices: every path is timed with its work, shared paths by their slowest rank."""
import json

import pytest
import torch

from mars.newton_schulz import NS_FORMS, newton_schulz_flops
from scripts.bench_newton_schulz import WORLD_SIZES, main, time_paths
from scripts.bench_optimizer import make_timer

MATRICES = [(64, 16)] * 3 + [(256, 16), (16, 16)]


def test_times_every_form_alone_and_batched_and_each_shared_layout():
    matrices = [torch.randn(shape) for shape in MATRICES]
    times = time_paths(matrices, torch.float32, reps=1, timer=make_timer(torch.device("cpu")))
    eager = [f"{form}, {how}" for form in NS_FORMS for how in ("one at a time", "batched by shape")]
    shared = [f"{w} ranks, slowest rank (products, one at a time)" for w in WORLD_SIZES]
    assert list(times) == eager + shared
    assert all(row["ms"] > 0 for row in times.values())
    for form in NS_FORMS:
        expected = sum(newton_schulz_flops(torch.Size(shape), form) for shape in MATRICES) / 1e12
        assert times[f"{form}, one at a time"]["tflop"] == pytest.approx(expected)
    assert times["fused_gram, one at a time"]["tflop"] < times["products, one at a time"]["tflop"]
    # With 8 ranks and 5 matrices, the slowest rank holds one matrix: the 256 x 16 one is the costliest.
    assert times["8 ranks, slowest rank (products, one at a time)"]["tflop"] <= newton_schulz_flops(
        torch.Size((256, 16)), "products") / 1e12


@pytest.mark.slow
def test_compiled_paths_run_and_the_script_writes_its_table(tmp_path, monkeypatch):
    monkeypatch.setattr("scripts.bench_newton_schulz.gpt2_shapes", lambda size: [(48, 16), (16, 48), (16,)])
    main(["--device", "cpu", "--reps", "1", "--compile", "--output-dir", str(tmp_path),
          "--paths", "products, one at a time", "fused_gram, one at a time, torch.compile"])
    record = json.loads((tmp_path / "bench_newton_schulz_cpu.json").read_text())
    assert list(record["paths"]) == ["products, one at a time", "fused_gram, one at a time, torch.compile"] + [
        f"{w} ranks, slowest rank (products, one at a time)" for w in WORLD_SIZES]
    assert record["matmul_tflops"] > 0
    table = (tmp_path / "bench_newton_schulz_cpu.md").read_text()
    assert "| fused_gram, one at a time, torch.compile |" in table


def test_profile_writes_where_the_time_of_each_path_goes(tmp_path, monkeypatch):
    monkeypatch.setattr("scripts.bench_newton_schulz.gpt2_shapes", lambda size: [(48, 16), (16, 48), (16,)])
    labels = ["products, one at a time", "fused_gram, batched by shape"]
    main(["--device", "cpu", "--reps", "1", "--profile", "--output-dir", str(tmp_path), "--paths", *labels])
    profile = (tmp_path / "profile_newton_schulz_cpu.md").read_text()
    assert "bench_newton_schulz --device cpu --reps 1 --profile" in profile
    sections = profile.split("\n## ")[1:]
    assert [section.splitlines()[0] for section in sections] == labels
    assert "aten::mm " in sections[0] and "aten::addmm " in sections[1]  # each path's own products
    assert all("ms wall time under the profiler" in section for section in sections)
