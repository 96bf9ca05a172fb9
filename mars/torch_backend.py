"""MARS and its AdamW fallback over whole lists of tensors with ``torch._foreach_*`` ops.

Same math as :mod:`mars.reference`, arranged for memory traffic: on the CPU the step is bandwidth bound, so
time goes with the number of elementwise passes over the parameters and with fresh allocations (page faults).
The rearrangements change rounding, not the math:

* moving averages use ``lerp`` (``m + (1 - b1) * (c - m)``), one pass instead of two, as ``torch.optim.AdamW``;
* Adam's bias corrections move into the step size and eps,
  ``m / ((sqrt(v) / s + eps) * bc1) = (s / bc1) * m / (sqrt(v) + eps * s)`` with ``s = sqrt(bc2)``;
* weight decay is a multiplication, ``p - lr * (wd * p + u) = p * (1 - lr * wd) - lr * u``;
* the norm clip divides by ``max(||c_t||, 1)``, which is the reference's branch without a host sync.

Buffers are reused instead of allocated: with ``remember_grad`` the corrected gradient c_t is built inside the
remembered-gradient buffer (refilled with this step's gradient at the end), and once the moments are updated
c_t's buffer holds the update direction.
"""
from collections.abc import Callable

import torch
from torch import Tensor

from mars.foreach_ops import add_scaled_, addcdiv_scaled_, cast_like, clip_to_unit_norm, working_copies, write_back
from mars.group_steps import group_steps
from mars.step_count import bias_correction, square_root


def _corrected_gradients(
    grads: list[Tensor], last_grads: list[Tensor], gamma: float, beta1: float, in_place: bool
) -> list[Tensor]:
    """c_t = g + gamma * beta1 / (1 - beta1) * (g - g_prev), clipped per tensor to L2 norm at most 1.

    With ``in_place`` the result is written into ``last_grads`` (whose old values are then gone).
    """
    correction_scale = gamma * (beta1 / (1.0 - beta1))
    if torch.compiler.is_compiling():
        return _traced_corrected_gradients(grads, last_grads, correction_scale)
    if in_place:
        # lerp(g_prev, g, 1 + s) = g_prev + (1 + s) * (g - g_prev) = g + s * (g - g_prev)
        torch._foreach_lerp_(last_grads, grads, 1.0 + correction_scale)
        corrected = last_grads
    else:
        # lerp(g, g_prev, -s) = g - s * (g_prev - g)
        corrected = torch._foreach_lerp(grads, last_grads, -correction_scale)
    clip_to_unit_norm(corrected)
    return corrected


def _traced_corrected_gradients(grads: list[Tensor], last_grads: list[Tensor], correction_scale: float) -> list[Tensor]:
    """c_t while traced (``torch.compile``): the eager path's lerp and clip, but as values of g and g_prev, no
    buffer written, each norm its own reduction. Inductor then computes c_t inside the norm's reduction and again
    inside the update that reads it, never storing it; a buffer written (or ``_foreach_norm``, which reads stored
    tensors) gets a fresh allocation per tensor per step in the compiled code, page faults on the CPU."""
    corrected = [torch.lerp(last, grad, 1.0 + correction_scale) for last, grad in zip(last_grads, grads)]
    return [c / torch.linalg.vector_norm(c).clamp_min(1.0) for c in corrected]


def _update_second_moment(
    exp_avg_sqs: list[Tensor],
    max_exp_avg_sqs: list[Tensor] | None,
    values: list[Tensor],
    beta2: float,
    amsgrad: bool,
) -> list[Tensor]:
    """v <- beta2 * v + (1 - beta2) * x^2; returns the second moment Adam divides by (its running max with amsgrad)."""
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, values, values, value=1.0 - beta2)
    if amsgrad:
        torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        return max_exp_avg_sqs
    return exp_avg_sqs


def _sqrt_into(outputs: list[Tensor], inputs: list[Tensor]) -> None:
    """outputs <- sqrt(inputs) elementwise, into existing buffers.

    A loop rather than ``_foreach_sqrt``, which allocates: a fresh multi-megabyte buffer costs page faults on
    every step (GPT-2's 50304x768 embedding on the 2-core CI CPU: 26 ms into an existing buffer, 139 ms into a
    new one), far more than the loop's few microseconds per tensor.
    """
    for output, value in zip(outputs, inputs):
        torch.sqrt(value, out=output)


def _sign_into(outputs: list[Tensor], inputs: list[Tensor]) -> None:
    """outputs <- sign(inputs) elementwise, into existing buffers (see :func:`_sqrt_into` for why a loop)."""
    for output, value in zip(outputs, inputs):
        torch.sign(value, out=output)


def _apply_updates(params: list[Tensor], lr: float, weight_decay: float,
                   add_update: Callable[[list[Tensor]], None]) -> None:
    """p <- p * (1 - lr * weight_decay), the decoupled weight decay, then ``add_update`` of the working copies
    (float32, or float64 for float64 parameters), written back into the parameters in their dtype."""
    works = working_copies(params)
    if weight_decay != 0.0:
        torch._foreach_mul_(works, 1.0 - lr * weight_decay)
    add_update(works)
    write_back(params, works)


def _adam_update(
    params: list[Tensor],
    exp_avgs: list[Tensor],
    denominators: list[Tensor],
    *,
    steps: list[int],
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> None:
    """p <- p * (1 - lr * wd) - lr * sqrt(bc2) / bc1 * m / (sqrt(v) + eps * sqrt(bc2)), per-tensor bias corrections.

    ``denominators`` holds sqrt(v) on entry and is overwritten.
    """
    sqrt_bias_corrections2 = [square_root(bias_correction(beta2, step)) for step in steps]
    torch._foreach_add_(denominators, [eps * correction for correction in sqrt_bias_corrections2])
    step_sizes = [-lr * correction / bias_correction(beta1, step)
                  for step, correction in zip(steps, sqrt_bias_corrections2)]
    _apply_updates(params, lr, weight_decay,
                   lambda works: addcdiv_scaled_(works, exp_avgs, denominators, step_sizes))


def _fused_step(params: list[Tensor], grads: list[Tensor], state: dict[str, list[Tensor]], *, steps: list[int],
                lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, gamma: float | None,
                lion: bool, amsgrad: bool, remember_grad: bool) -> None:
    """One step of MARS-AdamW, MARS-Lion or, with ``gamma=None``, AdamW on every tensor of the lists
    (:mod:`mars.group_steps`)."""
    if not params:
        return
    exp_avgs = state["exp_avg"]
    grads = cast_like(grads, exp_avgs)  # the state's dtype: float32, or float64 for float64 parameters
    if gamma is None:
        moment_inputs = grads
    else:
        moment_inputs = _corrected_gradients(grads, state["last_grad"], gamma, beta1, in_place=remember_grad)
    torch._foreach_lerp_(exp_avgs, moment_inputs, 1.0 - beta1)
    # From here on c_t is dead and its buffer is scratch for the update direction; the gradients are the caller's.
    # (Traced, no scratch: a value written into a buffer is stored, see _traced_corrected_gradients.)
    scratch = None if gamma is None or torch.compiler.is_compiling() else moment_inputs
    if lion:
        if scratch is None:
            signs = torch._foreach_sign(exp_avgs)
        else:
            _sign_into(scratch, exp_avgs)
            signs = scratch
        _apply_updates(params, lr, weight_decay, lambda works: add_scaled_(works, signs, -lr))
    else:
        second_moments = _update_second_moment(state["exp_avg_sq"], state.get("max_exp_avg_sq"), moment_inputs,
                                               beta2, amsgrad)
        if scratch is None:
            denominators = torch._foreach_sqrt(second_moments)
        else:
            _sqrt_into(scratch, second_moments)
            denominators = scratch
        _adam_update(params, exp_avgs, denominators, steps=steps, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                     weight_decay=weight_decay)
    if remember_grad:
        torch._foreach_copy_(state["last_grad"], grads)


mars_group_step, adamw_group_step = group_steps(_fused_step, "torch")
