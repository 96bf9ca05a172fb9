"""Muon's elementwise part over whole lists with ``torch._foreach_*`` ops: the momentum and Nesterov direction, the
shape-scaled update of the matrices and the authors' AdamW of the other tensors, each a few kernel launches per
operation for a whole group instead of one per tensor (GPT-2 small: 50 matrices and 98 vectors).

Each function is the list form of a per-tensor rule (``mars.muon.PER_TENSOR``, from :mod:`mars.reference`) and
performs each tensor's operations in that rule's order with its scalars, so on the CPU, where torch runs a
foreach op as a loop of the per-tensor op, the results are the per-tensor path's bit for bit (tested). Where a
scalar differs between tensors (the shape scale, AdamW's step size at each tensor's own step) the list is split
into one call per distinct value. On CUDA a foreach kernel may contract a multiply and an add into one fused
multiply-add where the per-tensor kernel does not, which moves a result by an ulp (see
:mod:`mars.mars_m_foreach`).
"""
import math
from collections import defaultdict

import torch
from torch import Tensor

from mars.mars_m_foreach import moonlight_directions

# Muon's matrix to orthogonalise is Moonlight's (mars.reference.moonlight_direction): b <- mu b + g,
# d = g + mu b (Nesterov) or b.
muon_directions = moonlight_directions


def by_value(values: list[float]) -> dict[float, list[int]]:
    """The indices of each distinct value."""
    indices = defaultdict(list)
    for index, value in enumerate(values):
        indices[value].append(index)
    return indices


def write_back(params: list[Tensor], works: list[Tensor]) -> None:
    """Copy each float32 working copy into its parameter (those that are their own working copy are done)."""
    copied = [(param, work) for param, work in zip(params, works) if work is not param]
    if copied:
        torch._foreach_copy_([param for param, _ in copied], [work for _, work in copied])


def scale_in_place(tensors: list[Tensor], scales: list[float]) -> None:
    """tensors[i].mul_(scales[i]) for every tensor, rounded as that per-tensor op rounds; scales of 1 skipped (exact).

    torch's CPU foreach multiply rounds a Python scalar to the tensors' dtype before multiplying (for bfloat16, a
    different product from ``mul_``'s), so on the CPU the scale goes in as a 0-dim tensor of the tensors' compute
    dtype, which multiplies as ``mul_`` does (tested); CUDA's foreach kernels take the scalar in that dtype already.
    """
    groups = defaultdict(list)
    for tensor, scale in zip(tensors, scales):
        if scale != 1.0:
            groups[scale, tensor.dtype, tensor.device].append(tensor)
    for (scale, dtype, device), scaled in groups.items():
        compute_dtype = torch.promote_types(dtype, torch.float32)
        torch._foreach_mul_(scaled, torch.tensor(scale, dtype=compute_dtype) if device.type == "cpu" else scale)


def shape_scales(params: list[Tensor]) -> list[float]:
    """sqrt(max(1, rows / cols)) of each matrix: the scale of its orthogonalised update (Muon, MARS-Shampoo)."""
    return [max(1.0, param.size(0) / param.size(1)) ** 0.5 for param in params]


@torch.no_grad()
def apply_muon_updates(params: list[Tensor], updates: list[Tensor], *, lr: float, weight_decay: float) -> None:
    """``mars.muon.apply_muon_update`` of every matrix: each update scaled in place, in its own dtype, by
    sqrt(max(1, rows / cols)), then p <- p (1 - lr * weight_decay) - lr * update on a float32 copy."""
    scale_in_place(updates, shape_scales(params))
    works = [param.float() for param in params]
    torch._foreach_mul_(works, 1.0 - lr * weight_decay)
    torch._foreach_add_(works, [update.float() for update in updates], alpha=-lr)
    write_back(params, works)


@torch.no_grad()
def authors_adamw_steps(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                        exp_avg_sqs: list[Tensor], *, steps: list[int], lr: float, beta1: float, beta2: float,
                        eps: float, weight_decay: float) -> None:
    """:func:`mars.reference.authors_adamw_step` of every tensor, each at its own ``steps[i]``."""
    grads = [grad.float() for grad in grads]
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denominators, eps)
    works = [param.float() for param in params]
    deltas = torch._foreach_mul(works, weight_decay)
    torch._foreach_addcdiv_(deltas, exp_avgs, denominators)
    step_sizes = [lr * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step) for step in steps]
    for step_size, indices in by_value(step_sizes).items():
        torch._foreach_mul_([deltas[i] for i in indices], -step_size)
    torch._foreach_add_(works, deltas)
    write_back(params, works)
