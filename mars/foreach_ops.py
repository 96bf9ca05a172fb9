"""Helpers that the foreach paths (:mod:`mars.mars_m_foreach`, :mod:`mars.muon_foreach`,
:mod:`mars.shampoo_foreach`) share to keep each tensor's arithmetic exactly that of its per-tensor rule."""
from collections import defaultdict

import torch
from torch import Tensor

from mars import reference


def by_value(values: list[float]) -> list[tuple[float, list[int]]]:
    """Each distinct value with its indices: one foreach call per value where a scalar differs between tensors.

    While traced (``torch.compile``), one pair per index: the values derive from each tensor's step count, a tensor
    there (:mod:`mars.step_count`), which cannot be compared or hashed without reading it on the host."""
    if torch.compiler.is_compiling():
        return [(value, [index]) for index, value in enumerate(values)]
    indices = defaultdict(list)
    for index, value in enumerate(values):
        indices[value].append(index)
    return list(indices.items())


def add_scaled_(tensors: list[Tensor], others: list[Tensor], scale: float | Tensor) -> None:
    """tensors[i] += scale * others[i], in place: ``_foreach_add_``'s alpha for a float scale; a tensor scale (a
    tensor lr in a traced step, :func:`mars.optimizer.step_lr`), which alpha does not take, multiplies first."""
    if torch.is_tensor(scale):
        torch._foreach_add_(tensors, torch._foreach_mul(others, scale))
    else:
        torch._foreach_add_(tensors, others, alpha=scale)


def addcdiv_scaled_(tensors: list[Tensor], numerators: list[Tensor], denominators: list[Tensor],
                    scales: list[float | Tensor]) -> None:
    """tensors[i] += scales[i] * numerators[i] / denominators[i], in place: one ``_foreach_addcdiv_`` for float
    scales; tensor ones (a tensor lr in a traced step), which its scalar list does not take, divide and multiply
    first. The scales derive from one lr, so all are tensors or none: the first tells (no scan on the hot path)."""
    if scales and torch.is_tensor(scales[0]):
        torch._foreach_add_(tensors, [numerator / denominator * scale
                                      for numerator, denominator, scale in zip(numerators, denominators, scales)])
    else:
        torch._foreach_addcdiv_(tensors, numerators, denominators, scales)


def cast_like(tensors: list[Tensor], like: list[Tensor]) -> list[Tensor]:
    """Each tensor in the dtype of its partner in ``like``; those already in it are returned as they are."""
    return [tensor.to(partner.dtype) for tensor, partner in zip(tensors, like)]


def working_copies(params: list[Tensor]) -> list[Tensor]:
    """Each parameter in :func:`mars.reference.working_dtype` (float32, or float64 for float64 ones): a float32
    parameter is its own working copy, not copied."""
    return [param.to(reference.working_dtype(param)) for param in params]


def clip_to_unit_norm(tensors: list[Tensor]) -> None:
    """Divide each tensor by its L2 norm where that exceeds 1, in place: the clip of MARS's c_t. Dividing by
    max(norm, 1) on the device is exact where the norm is at most 1, and reads no norm on the host."""
    norms = torch._foreach_norm(tensors)
    torch._foreach_clamp_min_(norms, 1.0)
    torch._foreach_div_(tensors, norms)


def write_back(params: list[Tensor], works: list[Tensor]) -> None:
    """Copy each working copy into its parameter (a parameter that is its own working copy is done already)."""
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
