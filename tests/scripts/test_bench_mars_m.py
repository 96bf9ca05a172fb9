"""scripts.bench_mars_m on a tiny parameter set: every optimizer, part and path is timed, and the elementwise part
really leaves Newton-Schulz out."""
import json

import pytest
import torch

from mars.newton_schulz import orthogonalise
from scripts import bench_mars_m
from scripts.bench_optimizer import make_params, step_of

# gpt2_shapes' layout in miniature: token and position embeddings, one block, the final norm.
TINY_SHAPES = [(64, 16), (32, 16), (16,), (48, 16), (16, 16), (16,), (64, 16), (16, 64), (16,)]


def test_times_every_optimizer_part_and_path_and_writes_the_table_and_json(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_mars_m, "gpt2_shapes", lambda model_size: TINY_SHAPES)
    bench_mars_m.main(["--device", "cpu", "--reps", "2", "--step-reps", "1", "--warmup", "1",
                       "--output-dir", str(tmp_path)])
    record = json.loads((tmp_path / "bench_mars_m_cpu.json").read_text())
    assert list(record["median_ms"]) == list(bench_mars_m.OPTIMIZERS)
    for parts in record["all_ms"].values():
        assert list(parts) == list(bench_mars_m.PARTS)
        assert [len(parts[part]["foreach"]) for part in parts] == [2, 1]  # --reps elementwise, --step-reps whole
        assert all(min(ms) > 0 for paths in parts.values() for ms in paths.values())
    table = (tmp_path / "bench_mars_m_cpu.md").read_text()
    assert "| MARS-M exact | elementwise |" in table and "| Moonlight | whole step |" in table
    assert "| Muon | elementwise |" in table
    assert "`python -m scripts.bench_mars_m --device cpu --reps 2" in table


@pytest.mark.parametrize("label, module", [("MARS-M exact", "mars_m"), ("Muon", "muon")])
def test_the_elementwise_part_leaves_newton_schulz_out_and_the_whole_step_runs_it(monkeypatch, label, module):
    calls = []
    monkeypatch.setattr(getattr(bench_mars_m, module), "orthogonalise",
                        lambda *args, **kwargs: calls.append(1) or orthogonalise(*args, **kwargs))
    params = make_params(TINY_SHAPES, torch.device("cpu"))
    step = step_of(bench_mars_m.OPTIMIZERS[label](params, ns_dtype=torch.float32))
    with bench_mars_m.newton_schulz_left_out():
        step()
    assert calls == []
    step()
    assert calls == [1]
