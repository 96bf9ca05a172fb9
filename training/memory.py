"""Running out of memory, told in one line: what was being allocated (the model's weights, the optimizer's state,
a micro-batch's activations), how much, and which setting lowers it. PyTorch's own report is a traceback ending
in ``alloc_cpu.cpp``'s enforce failure (or ``torch.OutOfMemoryError`` on a GPU), which names neither."""
import contextlib
import re

import torch

# How much PyTorch tried to allocate, as its CPU allocator and its CUDA caching allocator say it.
_CPU_REQUEST = re.compile(r"you tried to allocate (\d+) bytes")
_CUDA_REQUEST = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")


class OutOfMemory(ValueError):
    """An allocation failed for want of memory; the message names what it was for and what to lower."""


def is_out_of_memory(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def requested_size(err: BaseException) -> str | None:
    """How much the failed allocation asked for, in words (``147.4 MiB``); None where the error does not say."""
    cpu = _CPU_REQUEST.search(str(err))
    if cpu:
        return in_mib(int(cpu.group(1)))
    cuda = _CUDA_REQUEST.search(str(err))
    return cuda.group(1) if cuda else None


def in_mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:,.1f} MiB"


@contextlib.contextmanager
def allocating(what: str, device: torch.device, lower: str):
    """Turn running out of memory inside the block into :class:`OutOfMemory`: ``what`` was being allocated on
    ``device``, and ``lower`` says what to change."""
    try:
        yield
    except (RuntimeError, MemoryError) as err:  # MemoryError: Python's own allocations (numpy's too)
        if isinstance(err, RuntimeError) and not is_out_of_memory(err):
            raise
        size = requested_size(err)
        failed = f"an allocation of {size} failed" if size else "an allocation failed"
        raise OutOfMemory(f"out of memory on {device} allocating {what}; {failed}: {lower}") from None


def model_weights(num_params: int, device: torch.device):
    """Around building the model and moving it to ``device``."""
    return allocating(f"the model's weights ({num_params / 1e6:,.1f}M parameters, {in_mib(4 * num_params)} in "
                      "float32)", device, "train a smaller model (model.n_layer, model.n_embd), or where more "
                      "memory is free")


def optimizer_state(device: torch.device):
    """Around an optimizer step, which allocates the optimizer's state the first time."""
    return allocating("the optimizer's state", device, "train a smaller model (model.n_layer, model.n_embd), shard "
                      "the state over several processes with train.zero1=true, or run where more memory is free")


def micro_batch(batch_size: int, block_size: int, device: torch.device):
    """Around the forward and backward passes of micro-batches."""
    return allocating(f"the activations of a micro-batch (train.batch_size {batch_size} x train.block_size "
                      f"{block_size} tokens)", device, "lower train.batch_size (raise train.grad_accum_steps to keep "
                      "the global batch), or set train.loss_chunk_size to compute the logits a chunk at a time")
