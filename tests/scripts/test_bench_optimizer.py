"""scripts.bench_optimizer's host-time bench: its shrunk GPT-2 holds GPT-2's tensors, in its order and shape groups,
so that a step makes the calls a GPT-2 step makes."""
from collections import Counter

import pytest

from scripts import bench_optimizer


@pytest.mark.parametrize("model_size", sorted(bench_optimizer.MODEL_SIZES))
def test_the_shrunk_gpt2_has_gpt2s_tensors_in_its_order_and_shape_groups(model_size):
    real, tiny = bench_optimizer.gpt2_shapes(model_size), bench_optimizer.tiny_gpt2_shapes(model_size)
    assert [len(shape) for shape in tiny] == [len(shape) for shape in real]
    # Tensors share a shape in the shrunk list exactly where they do in GPT-2's: the same batches and groups.
    assert [sorted(Counter(real).values())] == [sorted(Counter(tiny).values())]
    assert [real.index(shape) for shape in real] == [tiny.index(shape) for shape in tiny]
    assert max(shape[0] * (shape[1] if len(shape) == 2 else 1) for shape in tiny) <= 40 * 32


def test_the_compiled_bench_times_each_optimizer_eager_and_compiled_in_turn():
    import torch

    torch.manual_seed(0)
    eager_params = bench_optimizer.make_params([(6, 4), (4,)], torch.device("cpu"))
    # dynamo alone: what is under test is the bench's rows and turns, not inductor's code.
    steps = bench_optimizer.compiled_candidates(eager_params, backend="eager")
    eager_labels = [label for label in steps if not label.endswith(bench_optimizer.COMPILED)]
    assert list(steps) == [name for label in eager_labels for name in (label, label + bench_optimizer.COMPILED)]
    assert bench_optimizer.BASELINE in eager_labels
    times = bench_optimizer.interleaved_times(steps, bench_optimizer.make_timer(torch.device("cpu")), reps=1,
                                              warmup=1)
    assert list(times) == list(steps) and all(len(each) == 1 for each in times.values())
    assert "compiled step" in bench_optimizer.markdown_table(times)
