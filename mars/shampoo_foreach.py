"""mars-shampoo's elementwise part over whole lists with ``torch._foreach_*`` ops: the corrected gradient c_t and
its clip, the momentum, and the shape-scaled update with weight decay, for the matrices that Newton-Schulz
orthogonalises in between (``MARS(mars_type="mars-shampoo")`` with a fast backend).

Each function performs each tensor's operations of :mod:`mars.reference` (``corrected_gradient``, the momentum
lines of ``mars_step``, ``apply_update``) in their order with their scalars, so on the CPU the results are the
reference's bit for bit (tested). The clip divides by max(||c_t||, 1) on the device, where the reference divides
only when the norm exceeds 1: dividing by 1 is exact, and no norm is read on the host (the reference's branch
waits for the GPU once per matrix).
"""
import torch
from torch import Tensor

from mars.foreach_ops import cast_like, clip_to_unit_norm, scale_in_place, shape_scales, working_copies, write_back


@torch.no_grad()
def shampoo_directions(grads: list[Tensor], last_grads: list[Tensor], exp_avgs: list[Tensor], *, gamma: float,
                       beta1: float, remember_grad: bool) -> list[Tensor]:
    """The matrices mars-shampoo orthogonalises, m_t / (1 - beta1), after m_t <- beta1 m + (1 - beta1) c_t; with
    ``remember_grad`` (the approximate scheme) ``last_grads`` then hold this step's gradients."""
    grads = cast_like(grads, last_grads)  # into the state's dtype: float32, or float64 for float64 parameters
    corrected = torch._foreach_sub(grads, last_grads)
    torch._foreach_mul_(corrected, gamma * (beta1 / (1.0 - beta1)))
    torch._foreach_add_(corrected, grads)
    clip_to_unit_norm(corrected)
    torch._foreach_mul_(exp_avgs, beta1)
    torch._foreach_add_(exp_avgs, corrected, alpha=1.0 - beta1)
    if remember_grad:
        torch._foreach_copy_(last_grads, grads)
    return torch._foreach_mul(exp_avgs, 1.0 / (1.0 - beta1))


@torch.no_grad()
def apply_shampoo_updates(params: list[Tensor], updates: list[Tensor], *, lr: float, weight_decay: float) -> None:
    """Each update cast to its parameter's working dtype and scaled in place by sqrt(max(1, rows / cols)), then
    p <- p - lr * (update + weight_decay * p) on a working copy of p (float32, or float64 for a float64 p), as
    :func:`mars.reference.apply_update` with ``decay_inside_add``."""
    works = working_copies(params)
    updates = cast_like(updates, works)
    scale_in_place(updates, shape_scales(params))
    deltas = torch._foreach_add(updates, works, alpha=weight_decay)  # one rounding, as the reference
    torch._foreach_mul_(deltas, -lr)
    torch._foreach_add_(works, deltas)
    write_back(params, works)
