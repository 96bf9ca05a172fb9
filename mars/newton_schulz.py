"""Newton-Schulz orthogonalisation of many matrices at once (Muon, MARS-Shampoo): same-shaped ones batched,
and under DDP shared out across the ranks, which all hold the same matrices."""
import torch
import torch.distributed as dist
from torch import Tensor

from mars import reference


def newton_schulz_cost(shape: torch.Size) -> int:
    """Multiply-adds of one Newton-Schulz iteration on a matrix of ``shape``, up to a constant."""
    small, large = sorted(shape)
    return small * small * large


def assign_owners(shapes: list[torch.Size], world_size: int) -> list[int]:
    """The rank that orthogonalises each matrix: largest first, each to the least loaded rank so far.

    Deterministic, so that every rank computes the same assignment from the same parameter list.
    """
    loads, owners = [0] * world_size, [0] * len(shapes)
    for index in sorted(range(len(shapes)), key=lambda i: -newton_schulz_cost(shapes[i])):
        owner = min(range(world_size), key=loads.__getitem__)
        owners[index] = owner
        loads[owner] += newton_schulz_cost(shapes[index])
    return owners


def orthogonalise(matrices: list[Tensor], steps: int = 5, dtype: torch.dtype = torch.bfloat16,
                  process_group: dist.ProcessGroup | None = None, eps: float = 1e-7, *,
                  norm_in_dtype: bool = False, out_dtype: torch.dtype = torch.float32,
                  gram_first: bool = False) -> list[Tensor]:
    """Newton-Schulz of each matrix; same-shaped ones go through as one batch (fewer, larger products).

    ``dtype`` and ``norm_in_dtype`` are :func:`mars.reference.newton_schulz5`'s; the results come back in
    ``out_dtype``. ``gram_first`` takes the MARS-M authors' product order instead
    (:func:`mars.reference.newton_schulz5_gram_polynomial`, which always normalises in ``dtype``): the same
    polynomial, rounded differently. With a ``process_group`` of several ranks, all holding the same ``matrices`` (DDP's
    all-reduced gradients), each rank orthogonalises its share (:func:`assign_owners`) and an all-reduce of one
    flat ``out_dtype`` buffer, zero outside each owner's slots, hands every rank all results exactly: the cost
    per rank falls with the number of ranks instead of being repeated on each, and N ranks return what one
    process does (a bfloat16 buffer, as the MARS authors' Muon sends, halves the traffic of a float32 one).
    """
    world_size = dist.get_world_size(process_group) if process_group is not None else 1
    rank = dist.get_rank(process_group) if process_group is not None else 0
    owners = assign_owners([m.shape for m in matrices], world_size)
    results: list[Tensor | None] = [None] * len(matrices)
    by_shape: dict[torch.Size, list[int]] = {}
    for index, matrix in enumerate(matrices):
        if owners[index] == rank:
            by_shape.setdefault(matrix.shape, []).append(index)
    if gram_first and not norm_in_dtype:
        raise ValueError("gram_first=True normalises in dtype (the MARS-M authors' form): pass norm_in_dtype=True")

    def newton_schulz(matrix: Tensor) -> Tensor:
        if gram_first:
            return reference.newton_schulz5_gram_polynomial(matrix, steps, eps, dtype)
        return reference.newton_schulz5(matrix, steps, eps, dtype, norm_in_dtype)

    for indices in by_shape.values():
        if len(indices) == 1:
            results[indices[0]] = newton_schulz(matrices[indices[0]])
        else:
            batch = torch.stack([matrices[i] for i in indices])
            for index, result in zip(indices, newton_schulz(batch)):
                results[index] = result
    if world_size == 1:
        return [result.to(out_dtype) for result in results]
    flat = torch.zeros(sum(m.numel() for m in matrices), dtype=out_dtype, device=matrices[0].device)
    views = flat.split([m.numel() for m in matrices])
    for view, result in zip(views, results):
        if result is not None:
            view.copy_(result.flatten())
    dist.all_reduce(flat, group=process_group)  # x + 0 + ... + 0 = x in any dtype: exact
    return [view.view_as(matrix) for view, matrix in zip(views, matrices)]
