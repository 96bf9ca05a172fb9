"""The hook for optimizers that evaluate at other weights than they train at (schedule-free AdamW's average, an EMA).

Such an optimizer defines ``eval()`` and ``train()``, as the ``schedulefree`` package's optimizers do: ``eval()``
puts the weights it evaluates at into the model's parameters, ``train()`` puts the training weights back. The
trainer calls ``train()`` once it is built (the package's optimizers start in eval mode and refuse to step), and
both around everything that scores or keeps the model for scoring: validation, the in-training HellaSwag, and the
checkpoint's ``eval_model`` (which evaluation, export and sampling read). The package's ``train()`` recomputes the
training weights from the average and its other sequence, a rounding away from where they were: the trainer
copies them back bit for bit after it, so that evaluating changes no step and a resume continues exactly. Under
ZeRO-1 each rank switches the parameters it owns and then receives the others' from their owners. An optimizer
without the two methods trains and evaluates at the same weights.
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


def start_training(optimizer: torch.optim.Optimizer) -> None:
    """Put a freshly built optimizer in its training mode (the ``schedulefree`` package's start in eval mode)."""
    if has_evaluation_weights(optimizer):
        switch_weights(optimizer, "train")


@contextlib.contextmanager
def evaluation_weights(optimizer: torch.optim.Optimizer):
    """Inside the block the model's parameters are the weights ``optimizer`` evaluates at; after it, its training
    weights bit for bit. Every rank must enter it (under ZeRO-1 it broadcasts)."""
    if not has_evaluation_weights(optimizer):
        yield
        return
    params = [param for group in optimizer.param_groups for param in group["params"]]
    training_weights = [param.detach().clone() for param in params]  # every rank holds them all, also under ZeRO
    switch_weights(optimizer, "eval")
    try:
        yield
    finally:
        switch_weights(optimizer, "train")
        with torch.no_grad():
            for param, weights in zip(params, training_weights):
                param.copy_(weights)


def evaluation_state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """A copy of the model's weights at the optimizer's evaluation weights, or None when it has none."""
    if not has_evaluation_weights(optimizer):
        return None
    with evaluation_weights(optimizer):
        return {key: value.detach().clone() for key, value in model.state_dict().items()}
