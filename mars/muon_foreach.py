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
import torch
from torch import Tensor

from mars.foreach_ops import add_scaled_, by_value, cast_like, scale_in_place, shape_scales, working_copies, write_back
from mars.mars_m_foreach import moonlight_directions
from mars.step_count import bias_correction, square_root

# Muon's matrix to orthogonalise is Moonlight's (mars.reference.moonlight_direction): b <- mu b + g,
# d = g + mu b (Nesterov) or b.
muon_directions = moonlight_directions


@torch.no_grad()
def apply_muon_updates(params: list[Tensor], updates: list[Tensor], *, lr: float, weight_decay: float) -> None:
    """``mars.muon.apply_muon_update`` of every matrix: each update scaled in place, in its own dtype, by
    sqrt(max(1, rows / cols)), then p <- p (1 - lr * weight_decay) - lr * update on a float32 (float64) copy."""
    scale_in_place(updates, shape_scales(params))
    works = working_copies(params)
    torch._foreach_mul_(works, 1.0 - lr * weight_decay)
    add_scaled_(works, cast_like(updates, works), -lr)
    write_back(params, works)


@torch.no_grad()
def authors_adamw_steps(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                        exp_avg_sqs: list[Tensor], *, steps: list[int], lr: float, beta1: float, beta2: float,
                        eps: float, weight_decay: float) -> None:
    """:func:`mars.reference.authors_adamw_step` of every tensor, each at its own ``steps[i]``."""
    grads = cast_like(grads, exp_avgs)
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    denominators = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denominators, eps)
    works = working_copies(params)
    deltas = torch._foreach_mul(works, weight_decay)
    torch._foreach_addcdiv_(deltas, exp_avgs, denominators)
    step_sizes = [lr * square_root(bias_correction(beta2, step)) / bias_correction(beta1, step) for step in steps]
    for step_size, indices in by_value(step_sizes):
        torch._foreach_mul_([deltas[i] for i in indices], -step_size)
    torch._foreach_add_(works, deltas)
    write_back(params, works)
