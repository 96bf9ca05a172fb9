"""Each tensor's step count, and Adam's bias corrections computed from it, in an eager step and a compiled one.

Eagerly a tensor's ``state["step"]`` is a Python int and the bias corrections are Python floats, as always (the
numbers the trainer and the checks against the authors' code read). While traced (``torch.compile``) an int read
from the state is a constant of the graph, and one that changes at every step makes a new graph at every step until
dynamo follows it as a symbol: the count is then a 0-dim float32 tensor on the parameter's device, incremented in
place (torch.optim's form of ``state["step"]`` under ``capturable``), an input whose new value needs no new graph,
and the bias corrections are tensors computed from it in float64 (each as close to the eager float as float64
arithmetic allows). Either form is read by either step: an eager step after compiled ones counts on from the
tensor's value as an int, a checkpoint saved with tensor counts (or torch.optim's) resumes.
"""
import math
from typing import Any

import torch
from torch import Tensor

StepCount = int | Tensor


def advance_steps(params: list[Tensor], states: list[dict[str, Any]]) -> list[StepCount]:
    """Increment and return each tensor's own step count (``params[i]``'s in ``states[i]``): ints eagerly, float64
    0-dim tensors while traced (the state keeps a float32 one)."""
    if not torch.compiler.is_compiling():
        for state in states:
            state["step"] = int(state.get("step", 0)) + 1
        return [state["step"] for state in states]
    steps = []
    for param, state in zip(params, states):
        count = state.get("step", 0)
        if torch.is_tensor(count):
            count.add_(1)
        else:  # the first traced step of this tensor (one graph is specialised to this int)
            count = state["step"] = torch.tensor(float(count + 1), dtype=torch.float32, device=param.device)
        steps.append(count.to(torch.float64))
    return steps


def bias_correction(beta: float, step: StepCount) -> float | Tensor:
    """1 - beta^step: a float for an int step, a tensor for a tensor one."""
    return 1.0 - beta**step


def square_root(value: float | Tensor) -> float | Tensor:
    """math.sqrt of a float (exactly rounded, as the eager step always computed it), Tensor.sqrt of a tensor."""
    return value.sqrt() if torch.is_tensor(value) else math.sqrt(value)
