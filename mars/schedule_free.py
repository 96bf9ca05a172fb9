"""Schedule-free SGD (Defazio et al., "The Road Less Scheduled", NeurIPS 2024, arXiv 2405.15682; Algorithm 1 with SGD
as its base step and the average uniform): no lr decay, and the weights it is evaluated at are an average of its
iterates, not the weights it trains at.

With ``lr`` the step size, ``beta`` the interpolation (``momentum``) and ``g(y)`` the gradient at the parameters::

    z_{t+1} = z_t - lr (g(y_t) + weight_decay y_t)           the base SGD sequence
    x_{t+1} = (1 - c_{t+1}) x_t + c_{t+1} z_{t+1}             its average, c_{t+1} = 1 / (t + 1)
    y_{t+1} = (1 - beta) z_{t+1} + beta x_{t+1}               the parameters it trains at

from z_0 = x_0 = y_0, the initial parameters. ``eval()`` puts x into the parameters and ``train()`` puts y back,
as the ``schedulefree`` package's optimizers do (training/eval_weights.py): y is kept while it is out, not
recomputed, so the round trip is exact. The updates are not linear in lr: at lr 0 z stays, but x still moves
towards it, and y with it.
"""
from typing import Any

import torch
from torch import Tensor

from mars.optimizer import OneRuleOptimizer, check_non_negative, step_lr
from mars.reference import working_dtype
from mars.step_count import advance_steps


class ScheduleFreeSGD(OneRuleOptimizer):
    """Schedule-free SGD; state per tensor: the base sequence ``z``, the average ``x`` (float32, float64 for float64
    parameters) and the step count; ``y``, the training weights, while ``eval()`` has them out."""

    UPDATES_LINEAR_IN_LR = False

    def __init__(self, params, lr: float = 1.0, momentum: float = 0.9, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    def _check_group(self, group: dict[str, Any]) -> None:
        if not 0.0 <= group["momentum"] < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {group['momentum']!r}")
        check_non_negative(weight_decay=group["weight_decay"])

    def _update(self, params: list[Tensor], group: dict[str, Any]) -> None:
        lr, beta, decay = step_lr(group["lr"]), group["momentum"], group["weight_decay"]
        states = self._states(params)
        for param, state in zip(params, states):
            if "z" not in state:
                start = param.detach().to(working_dtype(param), copy=True)
                state.update(z=start, x=start.clone())
        for param, state, step in zip(params, states, advance_steps(params, states)):
            z, x = state["z"], state["x"]
            y = param.detach().to(z.dtype)
            direction = param.grad.to(z.dtype)
            if decay != 0.0:
                direction = direction + decay * y
            z.sub_(lr * direction)
            average_weight = 1.0 / step  # a tensor in a traced step (mars.step_count), lerp's weight in x's dtype
            x.lerp_(z, average_weight.to(x.dtype) if torch.is_tensor(average_weight) else average_weight)
            param.copy_(torch.lerp(z, x, beta))

    @torch.no_grad()
    def eval(self) -> None:
        """Put the average x into the parameters, keeping the training weights y."""
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state.get(param)
                if state and "y" not in state:
                    state["y"] = param.detach().clone()
                    param.copy_(state["x"])

    @torch.no_grad()
    def train(self) -> None:
        """Put the training weights y back, bit for bit."""
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state.get(param)
                if state and "y" in state:
                    param.copy_(state.pop("y"))
