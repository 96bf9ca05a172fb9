"""scripts.bench_newton_schulz on small matrices: every path is timed, shared paths by their slowest rank."""
import torch

from scripts.bench_newton_schulz import WORLD_SIZES, time_paths
from scripts.bench_optimizer import make_timer


def test_times_every_path_and_each_shared_layout():
    matrices = [torch.randn(shape) for shape in [(64, 16)] * 3 + [(256, 16), (16, 16)]]
    times = time_paths(matrices, torch.float32, reps=1, timer=make_timer(torch.device("cpu")))
    assert list(times) == ["one at a time", "batched by shape"] + [f"{w} ranks, slowest rank" for w in WORLD_SIZES]
    assert all(ms > 0 for ms in times.values())
