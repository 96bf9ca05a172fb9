"""The elementwise part of MARS-M, its memory-efficient form and Moonlight over whole lists of tensors with
``torch._foreach_*`` ops: a few kernel launches per operation for a whole group instead of one per tensor.

Each function is a list form of a per-tensor rule of :mod:`mars.reference` (named in its docstring) and performs
each tensor's operations in the reference's order with the reference's scalars, so on the CPU, where torch runs a
foreach op as a loop of the per-tensor op, the results are the reference's bit for bit (tested). Two places
where the reference does something per tensor take another form with the same result:

* the clip of c_t (divide by its norm when the norm exceeds 1) divides by max(norm, 1), computed on the device:
  dividing by 1 is exact, so it is the branch without a host sync. (torch's CUDA foreach division takes its fast
  path only for same-shaped operands, so this one division still runs as one kernel per matrix.)
* a scalar that differs between tensors (the shape-scaled step size, AdamW's bias correction at each tensor's
  own step) splits the list into one call per distinct value: three for GPT-2's matrices, one for the rest.

On CUDA, torch's foreach kernels round each operation as the per-tensor kernels do; they may contract a
multiply and an add into one fused multiply-add where the per-tensor kernel does not (or the reverse), which
moves a result by an ulp. The two paths have not been compared on a GPU yet.
"""
import torch
from torch import Tensor

from mars import reference
from mars.foreach_ops import add_scaled_, by_value, cast_like, clip_to_unit_norm, write_back


def _step_by(params: list[Tensor], directions: list[Tensor], step_sizes: list[float], *, lr: float,
             weight_decay: float) -> None:
    """p <- p (1 - lr * weight_decay) - step_size * direction, on a float32 (or float64) working copy of each
    parameter written back in its dtype, as the reference's ``work.mul_(...).add_(..., alpha=-step_size)``."""
    works = [param.to(torch.promote_types(param.dtype, torch.float32)) for param in params]
    torch._foreach_mul_(works, 1 - lr * weight_decay)
    directions = cast_like(directions, works)
    for step_size, indices in by_value(step_sizes):
        add_scaled_([works[i] for i in indices], [directions[i] for i in indices], -step_size)
    write_back(params, works)


def mars_m_momenta(grads: list[Tensor], last_grads: list[Tensor], momentum_buffers: list[Tensor], *,
                   momentum: float, gamma: float, clip_c: bool, remember_grad: bool) -> list[Tensor]:
    """:func:`mars.reference.mars_m_momentum` of every tensor; returns the momentum buffers (updated in place).

    With ``remember_grad`` (the approximate scheme) ``last_grads`` end up holding this step's gradients, and c_t is
    built in them meanwhile instead of in fresh buffers: (g_prev - g) * -s is (g - g_prev) * s exactly, since
    negation is exact.
    """
    grads = cast_like(grads, momentum_buffers)
    correction = gamma * momentum / (1 - momentum)
    if remember_grad:
        corrected = last_grads
        torch._foreach_sub_(corrected, grads)
        torch._foreach_mul_(corrected, -correction)
    else:
        corrected = torch._foreach_sub(grads, last_grads)
        torch._foreach_mul_(corrected, correction)
    torch._foreach_add_(corrected, grads)
    if clip_c:
        clip_to_unit_norm(corrected)
    torch._foreach_mul_(momentum_buffers, momentum)
    torch._foreach_add_(momentum_buffers, corrected, alpha=1 - momentum)
    if remember_grad:
        torch._foreach_copy_(last_grads, grads)
    return momentum_buffers


def mars_m_efficient_directions(grads: list[Tensor], momentum_buffers: list[Tensor], *, momentum: float,
                                gamma: float) -> list[Tensor]:
    """:func:`mars.reference.mars_m_efficient_direction` of every tensor."""
    grads = cast_like(grads, momentum_buffers)
    torch._foreach_mul_(momentum_buffers, momentum)
    torch._foreach_add_(momentum_buffers, grads, alpha=(1 - gamma) * (1 - momentum) / momentum)
    directions = torch._foreach_mul(grads, gamma)
    torch._foreach_add_(directions, momentum_buffers, alpha=momentum)
    return directions


def moonlight_directions(grads: list[Tensor], momentum_buffers: list[Tensor], *, momentum: float,
                         nesterov: bool) -> list[Tensor]:
    """:func:`mars.reference.moonlight_direction` of every tensor."""
    grads = cast_like(grads, momentum_buffers)
    torch._foreach_mul_(momentum_buffers, momentum)
    torch._foreach_add_(momentum_buffers, grads)
    if not nesterov:
        return momentum_buffers
    return torch._foreach_add(grads, momentum_buffers, alpha=momentum)


@torch.no_grad()
def apply_shape_scaled_updates(params: list[Tensor], updates: list[Tensor], *, lr: float,
                               weight_decay: float) -> None:
    """:func:`mars.reference.apply_shape_scaled_update` of every matrix."""
    step_sizes = [reference.shape_scaled_lr(lr, param.shape) for param in params]
    _step_by(params, updates, step_sizes, lr=lr, weight_decay=weight_decay)


@torch.no_grad()
def mars_m_adamw_steps(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                       exp_avg_sqs: list[Tensor], *, steps: list[int], lr: float, beta1: float, beta2: float,
                       eps: float, weight_decay: float) -> None:
    """:func:`mars.reference.mars_m_adamw_step` of every tensor, each at its own ``steps[i]``."""
    grads = cast_like(grads, exp_avgs)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_lerp_(exp_avg_sqs, torch._foreach_mul(grads, grads), 1 - beta2)
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denominators, eps)
    directions = torch._foreach_div(exp_avgs, denominators)
    step_sizes = [lr / ((1 - beta1**step) / (1 - beta2**step) ** 0.5) for step in steps]
    _step_by(params, directions, step_sizes, lr=lr, weight_decay=weight_decay)
