"""State dicts that an earlier version of mars saved, for the test that later versions load them and step on.

``state_dicts_<commit>.pt`` was written by mars as of that commit (7554a9e, which kept MARS's lr_1d and Muon's
adamw_lr as a ratio to lr; 07c07da, which kept them as rates), from a checkout of it::

    PYTHONPATH=<checkout of the commit> python tests/mars/saved_state_dicts.py tests/mars/state_dicts_<commit>.pt

For each case: the parameters after two steps, the optimizer's state dict then, and the parameters that version's
third step gave (the gradients are a seeded function of the step, :func:`gradients`).
"""
import copy
import sys

import torch

import mars

# name: (optimizer class in mars, constructor options, parameter dtype). A matrix and a vector, so that both rules of
# every optimizer keep state.
CASES = {
    "mars-adamw-exact": ("MARS", dict(backend="torch", is_approx=False, amsgrad=True), torch.float32),
    "mars-shampoo": ("MARS", dict(backend="torch", mars_type="mars-shampoo", ns_dtype=torch.float32), torch.float32),
    "muon-bfloat16": ("Muon", dict(ns_dtype=torch.float32), torch.bfloat16),
    "mars-m-exact": ("MarsM", dict(is_approx=False, ns_dtype=torch.float32), torch.float32),
    "mars-m-efficient": ("MarsMEfficient", dict(ns_dtype=torch.float32), torch.float32),
    "moonlight": ("Moonlight", dict(ns_dtype=torch.float32), torch.float32),
}
SHAPES = [(5, 3), (3,)]
SAVED_AFTER = 2  # steps


def gradients(step: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """A seeded function of the step: the gradients (even steps) or look-ahead gradients (odd) of step // 2."""
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in SHAPES]


def initial_params(dtype: torch.dtype) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtype)) for shape in SHAPES]


def new_optimizer(case: str, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    class_name, options, _ = CASES[case]
    return getattr(mars, class_name)(params, **options)


def step(optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter], step_index: int) -> None:
    """One training-loop iteration: in the exact scheme the look-ahead gradient is stashed first."""
    dtype = params[0].dtype
    if getattr(optimizer, "needs_lookahead_grad", False):
        for param, grad in zip(params, gradients(2 * step_index + 1, dtype)):
            param.grad = grad
        optimizer.stash_lookahead_grad()
    for param, grad in zip(params, gradients(2 * step_index, dtype)):
        param.grad = grad
    optimizer.step()
    optimizer.zero_grad()


def saved_case(case: str) -> dict:
    params = initial_params(CASES[case][2])
    optimizer = new_optimizer(case, params)
    for step_index in range(SAVED_AFTER):
        step(optimizer, params, step_index)
    saved = dict(params=[param.detach().clone() for param in params], state_dict=copy.deepcopy(optimizer.state_dict()))
    step(optimizer, params, SAVED_AFTER)
    saved["stepped"] = [param.detach().clone() for param in params]
    return saved


if __name__ == "__main__":
    torch.save({case: saved_case(case) for case in CASES}, sys.argv[1])
