"""The list interface of the fast MARS backends (:mod:`mars.torch_backend`, :mod:`mars.triton_backend`), written
once over each backend's one rule.

A backend implements a single step over lists, ``fused_step(params, grads, state, *, steps, lr, beta1, beta2, eps,
weight_decay, gamma, lion, amsgrad, remember_grad)``, in which AdamW is MARS-AdamW without the correction
(``gamma=None``), as torch.optim writes each rule once beneath its single-tensor, foreach and fused paths;
:func:`group_steps` turns it into the ``mars_group_step`` and ``adamw_group_step`` the optimizer calls, which pick
the state buffers each rule reads (``state``: a buffer's name to its list).
"""
from collections.abc import Callable

import torch
from torch import Tensor

# mars-shampoo's matrices take Newton-Schulz (mars.shampoo_foreach); its other tensors take mars-adamw.
LIST_MARS_TYPES = ("mars-adamw", "mars-lion")


def group_steps(fused_step: Callable[..., None], backend: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """``mars_group_step`` and ``adamw_group_step`` of the backend named ``backend`` over its ``fused_step``."""

    @torch.no_grad()
    def mars_group_step(params: list[Tensor], grads: list[Tensor], last_grads: list[Tensor], exp_avgs: list[Tensor],
                        exp_avg_sqs: list[Tensor] | None, max_exp_avg_sqs: list[Tensor] | None, *, steps: list[int],
                        lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, gamma: float,
                        mars_type: str, amsgrad: bool, remember_grad: bool) -> None:
        """One MARS-AdamW or MARS-Lion step on every tensor of the lists (see :func:`mars.reference.mars_step`).

        ``exp_avg_sqs`` is read only by mars-adamw, ``max_exp_avg_sqs`` only by mars-adamw with ``amsgrad``.
        With ``remember_grad`` each ``last_grads[i]`` ends the step holding a copy of ``grads[i]`` in the state's
        dtype.
        """
        if mars_type not in LIST_MARS_TYPES:
            raise ValueError(f"mars_type must be one of {LIST_MARS_TYPES} in the {backend} backend, got {mars_type!r}")
        lion = mars_type == "mars-lion"
        state = {"last_grad": last_grads, "exp_avg": exp_avgs}
        if not lion:
            state["exp_avg_sq"] = exp_avg_sqs
            if amsgrad:
                state["max_exp_avg_sq"] = max_exp_avg_sqs
        fused_step(params, grads, state, steps=steps, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                   weight_decay=weight_decay, gamma=gamma, lion=lion, amsgrad=amsgrad and not lion,
                   remember_grad=remember_grad)

    @torch.no_grad()
    def adamw_group_step(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor],
                         max_exp_avg_sqs: list[Tensor] | None, *, amsgrad: bool, **adam: float | list[int]) -> None:
        """One AdamW step on every tensor of the lists (see :func:`mars.reference.adamw_step`); ``adam``: its
        ``steps``, ``lr``, ``beta1``, ``beta2``, ``eps`` and ``weight_decay``, as :func:`mars_group_step`'s."""
        state = {"exp_avg": exp_avgs, "exp_avg_sq": exp_avg_sqs}
        if amsgrad:
            state["max_exp_avg_sq"] = max_exp_avg_sqs
        fused_step(params, grads, state, **adam, gamma=None, lion=False, amsgrad=amsgrad, remember_grad=False)

    return mars_group_step, adamw_group_step
