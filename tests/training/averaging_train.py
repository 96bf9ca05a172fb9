"""train.py with optimizer=adamw built as AveragingAdamW: a test-only optimizer that evaluates at other weights than
it trains at, through the hook of training/eval_weights.py. Run as ``python -m tests.training.averaging_train
<overrides>``."""
import dataclasses

import torch

import train
from configs import registry


class AveragingAdamW(torch.optim.AdamW):
    """AdamW that keeps an exponential average of each parameter (as an EMA, or schedule-free AdamW's x) and
    evaluates at it."""

    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for param in group["params"]:
                state = self.state[param]
                if "average" in state:
                    state["average"].lerp_(param.detach(), 0.5)
                else:
                    state["average"] = param.detach().clone()
        return loss

    def eval(self):
        for param, state in self.state.items():
            state["training_weights"] = param.detach().clone()
            param.data.copy_(state["average"])

    def train(self):
        for param, state in self.state.items():
            if "training_weights" in state:
                param.data.copy_(state.pop("training_weights"))


def averaging_adamw_arguments(cfg, device):
    _, arguments = registry.adamw_arguments(cfg, device)
    return AveragingAdamW, arguments


if __name__ == "__main__":
    registry.OPTIMIZERS["adamw"] = dataclasses.replace(registry.OPTIMIZERS["adamw"],
                                                       arguments=averaging_adamw_arguments)
    train.main()
