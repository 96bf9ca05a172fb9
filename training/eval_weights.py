"""The hook for optimizers that evaluate at other weights than they train at (schedule-free AdamW's average, an EMA).

Such an optimizer defines ``eval()`` and ``train()``, as the ``schedulefree`` package's optimizers do: ``eval()``
puts the weights it evaluates at into the model's parameters, ``train()`` puts the training weights back exactly.
The trainer calls them around everything that scores or keeps the model for scoring: validation, the in-training
HellaSwag, and the checkpoint's ``eval_model`` (which evaluation, export and sampling read). Under ZeRO-1 each
rank switches the parameters it owns and then receives the others' from their owners. An optimizer without the
two methods trains and evaluates at the same weights.
"""
import contextlib

import torch
from training.optimizers import is_zero, local_optimizer


def has_evaluation_weights(optimizer: torch.optim.Optimizer) -> bool:
    local = local_optimizer(optimizer)
    return callable(getattr(local, "eval", None)) and callable(getattr(local, "train", None))


def switch_weights(optimizer: torch.optim.Optimizer, mode: str) -> None:
    """Put the optimizer's ``eval`` or ``train`` weights into the model's parameters, on every rank."""
    getattr(local_optimizer(optimizer), mode)()
    if is_zero(optimizer):
        optimizer._sync_params()  # each rank switched its own shard: the owners broadcast theirs, as after a step


@contextlib.contextmanager
def evaluation_weights(optimizer: torch.optim.Optimizer):
    """Inside the block the model's parameters are the weights ``optimizer`` evaluates at; after it, its training
    weights. Every rank must enter it (under ZeRO-1 it broadcasts)."""
    if not has_evaluation_weights(optimizer):
        yield
        return
    switch_weights(optimizer, "eval")
    try:
        yield
    finally:
        switch_weights(optimizer, "train")


def evaluation_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """A copy of the model's weights at the optimizer's evaluation weights, or None when it has none."""
    if not has_evaluation_weights(optimizer):
        return None
    with evaluation_weights(optimizer):
        return {key: value.detach().clone() for key, value in model.state_dict().items()}
