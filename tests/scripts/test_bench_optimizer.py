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
