"""Running out of memory is one line naming what was being allocated, its size and what to lower: tested with a
real allocation that fails (more than the address space holds, or more than ``ulimit -v`` allows)."""
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training import memory

REPO = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")
MORE_THAN_ANY_ADDRESS_SPACE = 2**50  # bytes: a petabyte


@pytest.mark.parametrize("allocating, phrases", [
    (memory.model_weights(10**6, CPU), ["the model's weights (1.0M parameters, 3.8 MiB in float32)", "model.n_embd"]),
    (memory.optimizer_state(CPU), ["the optimizer's state", "train.zero1=true"]),
    (memory.micro_batch(8, 128, CPU), ["a micro-batch (train.batch_size 8 x train.block_size 128 tokens)",
                                      "lower train.batch_size", "train.loss_chunk_size"]),
], ids=["weights", "optimizer-state", "micro-batch"])
def test_an_allocation_that_fails_names_what_it_was_for_its_size_and_what_to_lower(allocating, phrases):
    with pytest.raises(memory.OutOfMemory) as refused:
        with allocating:
            torch.empty(MORE_THAN_ANY_ADDRESS_SPACE, dtype=torch.uint8)
    message = str(refused.value)
    assert message.startswith("out of memory on cpu allocating ") and "\n" not in message
    assert "an allocation of 1,073,741,824.0 MiB failed" in message, message
    assert all(phrase in message for phrase in phrases), message


def test_errors_other_than_running_out_of_memory_pass_through():
    with pytest.raises(RuntimeError, match="shape"), memory.optimizer_state(CPU):
        torch.ones(2, 3) @ torch.ones(2, 3)


def train_under_address_space_limit(run_dir, *overrides, limit_bytes=3 * 2**30):
    """train.py with ``ulimit -v`` at ``limit_bytes``: enough for Python and PyTorch, not for what the overrides
    ask for."""
    return subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", "train.device=cpu",
                           "train.max_iters=1", "train.eval_iters=1", *overrides], cwd=REPO, capture_output=True,
                          text=True, timeout=600,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes)))


@pytest.mark.slow
@pytest.mark.parametrize("overrides, phrases", [
    (["model=gpt2-xl"], ["allocating the model's weights (1,556.8M parameters, 5,938.9 MiB in float32)",
                         "train a smaller model (model.n_layer, model.n_embd)"]),
    (["train.batch_size=4096", "train.block_size=16"],
     ["allocating the activations of a micro-batch (train.batch_size 4096 x train.block_size 16 tokens)",
      "lower train.batch_size"]),
], ids=["model", "batch"])
def test_running_out_of_memory_at_start_is_one_line_naming_the_allocation(tmp_path, overrides, phrases):
    from tests.test_one_line_errors import assert_one_line

    result = train_under_address_space_limit(tmp_path / "run", *overrides)
    assert_one_line(result, "out of memory on cpu", "MiB failed", *phrases)
