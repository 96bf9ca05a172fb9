"""Newton-Schulz orthogonalisation of many matrices at once (Muon, MARS-Shampoo, MARS-M), in one of three
product orders, one matrix at a time or same-shaped ones batched, and under DDP shared out across the ranks,
which all hold the same matrices."""
import functools

import torch
import torch.distributed as dist
from torch import Tensor

from mars import reference
from mars.cuda_graph import CapturedLists

# The same quintic, three ways of forming it (the results differ only by rounding; tests/mars/test_newton_schulz.py):
#   products:    X <- a X + b (A X) + c A (A X),  A = X X^T   the MARS authors' Muon and MARS-Shampoo
#   gram:        X <- a X + (b A + c A A) X                   the MARS-M authors' (and Muon's current) form
#   fused_gram:  the gram form with a and (b, c) applied inside the matrix products (addmm), so each iteration
#                is three kernels, and each product is rounded once to ``dtype`` instead of once per operation.
# For an m x n matrix (m <= n) products costs 6 m^2 n flops per iteration, gram 4 m^2 n + 2 m^3.
NS_FORMS = ("products", "gram", "fused_gram")


def newton_schulz_cost(shape: torch.Size) -> int:
    """Multiply-adds of one Newton-Schulz iteration on a matrix of ``shape``, up to a constant."""
    small, large = sorted(shape)
    return small * small * large


def newton_schulz_flops(shape: torch.Size, form: str, steps: int = 5) -> int:
    """Floating-point operations of ``steps`` iterations on one matrix of ``shape`` in ``form`` (matrix products only)."""
    small, large = sorted(shape[-2:])
    per_iteration = 6 * small * small * large if form == "products" else 4 * small * small * large + 2 * small**3
    return steps * per_iteration


def newton_schulz5_fused_gram(matrix: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16,
                              norm_in_dtype: bool = True) -> Tensor:
    """:func:`mars.reference.newton_schulz5` in the fused Gram form (see ``NS_FORMS``); a batch too.

    The ``dtype`` copy is divided by its own norm (``norm_in_dtype``) or by the norm of ``matrix``, plus
    ``eps``, as in the reference.
    """
    a, b, c = reference.NEWTON_SCHULZ_COEFFS
    x, transposed = reference.normalised_wide(matrix, eps, dtype, norm_in_dtype)
    product, add_product = (torch.mm, torch.addmm) if matrix.dim() == 2 else (torch.bmm, torch.baddbmm)
    for _ in range(steps):
        gram = product(x, x.mT)
        polynomial = add_product(gram, gram, gram, beta=b, alpha=c)
        x = add_product(x, polynomial, x, beta=a)
    if transposed:
        x = x.mT
    return x.to(matrix.dtype)


def newton_schulz5(matrix: Tensor, steps: int, eps: float, dtype: torch.dtype, norm_in_dtype: bool,
                   form: str) -> Tensor:
    """Newton-Schulz of one matrix or a batch in ``form``."""
    if form == "products":
        return reference.newton_schulz5(matrix, steps, eps, dtype, norm_in_dtype)
    if form == "gram":
        return reference.newton_schulz5_gram_polynomial(matrix, steps, eps, dtype)
    return newton_schulz5_fused_gram(matrix, steps, eps, dtype, norm_in_dtype)


def check_ns_form(form: str, norm_in_dtype: bool) -> None:
    """Raise a ValueError for an unknown form, or the gram form asked to normalise by the float32 norm
    (MARS-Shampoo's normalisation, and Muon's with float32 updates)."""
    if form not in NS_FORMS:
        raise ValueError(f"ns_form must be one of {NS_FORMS}, got {form!r}")
    if form == "gram" and not norm_in_dtype:
        raise ValueError("ns_form='gram' must normalise by the norm taken in the Newton-Schulz dtype (the MARS-M "
                         "authors' form; Muon does so with update_dtype=bfloat16 only, mars-shampoo never): take "
                         "ns_form='fused_gram', the same form normalised either way")


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


def newton_schulz_each(matrices: list[Tensor], steps: int, eps: float, dtype: torch.dtype, norm_in_dtype: bool,
                       form: str, batch: bool, out_dtype: torch.dtype) -> list[Tensor]:
    """Newton-Schulz of each matrix in ``out_dtype``: one at a time, or with ``batch`` the matrices of one shape,
    dtype and device stacked (a stack of mixed dtypes would promote them all to the widest)."""
    groups: dict[object, list[int]] = {}
    for index, matrix in enumerate(matrices):
        groups.setdefault((matrix.shape, matrix.dtype, matrix.device) if batch else index, []).append(index)
    results: list[Tensor | None] = [None] * len(matrices)
    for indices in groups.values():
        if len(indices) == 1:
            results[indices[0]] = newton_schulz5(matrices[indices[0]], steps, eps, dtype, norm_in_dtype, form)
        else:
            stacked = torch.stack([matrices[i] for i in indices])
            for index, result in zip(indices, newton_schulz5(stacked, steps, eps, dtype, norm_in_dtype, form)):
                results[index] = result
    return [result.to(out_dtype) for result in results]


def orthogonalise(matrices: list[Tensor], steps: int = 5, dtype: torch.dtype = torch.bfloat16,
                  process_group: dist.ProcessGroup | None = None, eps: float = 1e-7, *,
                  norm_in_dtype: bool = False, out_dtype: torch.dtype = torch.float32,
                  form: str = "products", batch: bool = False, graph: CapturedLists | None = None) -> list[Tensor]:
    """Newton-Schulz of each matrix, in ``form`` (``NS_FORMS``).

    ``dtype`` and ``norm_in_dtype`` are :func:`mars.reference.newton_schulz5`'s; the results come back in
    ``out_dtype``. ``batch`` stacks same-shaped matrices into one batch (fewer, larger products; each matrix
    normalised by its own norm, so on the CPU each result is bit for bit the one it is alone); off by default:
    slower than one matrix at a time on a CPU and on an H100 of 2026-11-23, 0.24-0.37x of it on an H200 of
    2026-11-27 (docs/speed.md). The optimizers offer it as ``ns_batch``. With a ``graph`` (CUDA tensors only) this
    rank's work runs as one CUDA graph, captured on the first call and replayed after
    (:class:`mars.cuda_graph.CapturedLists`: the same kernels without a launch each; without a ``process_group`` the
    results are the graph's output buffers, overwritten by its next call). With a ``process_group`` of several
    ranks, all holding the same ``matrices`` (DDP's all-reduced gradients), each rank orthogonalises its share
    (:func:`assign_owners`) and an all-reduce of one flat ``out_dtype`` buffer, zero outside each owner's slots,
    hands every rank all results exactly: the cost per rank falls with the number of ranks instead of being
    repeated on each, and N ranks return what one process does (a bfloat16 buffer, as the MARS authors' Muon
    sends, halves the traffic of a float32 one).
    """
    check_ns_form(form, norm_in_dtype)
    world_size = dist.get_world_size(process_group) if process_group is not None else 1
    rank = dist.get_rank(process_group) if process_group is not None else 0
    owners = assign_owners([m.shape for m in matrices], world_size)
    mine = [index for index, owner in enumerate(owners) if owner == rank]
    options = dict(steps=steps, eps=eps, dtype=dtype, norm_in_dtype=norm_in_dtype, form=form, batch=batch,
                   out_dtype=out_dtype)
    local = [matrices[index] for index in mine]
    if not local:
        local_results = []
    elif graph is None:
        local_results = newton_schulz_each(local, **options)
    else:
        # Normalised by the dtype copy's own norm, the matrices enter as that copy: the graph holds them so.
        local_results = graph(functools.partial(newton_schulz_each, **options), local,
                              key=tuple(sorted(options.items())), input_dtype=dtype if norm_in_dtype else None)
    if world_size == 1:
        return local_results
    flat = torch.zeros(sum(m.numel() for m in matrices), dtype=out_dtype, device=matrices[0].device)
    views = flat.split([m.numel() for m in matrices])
    for index, result in zip(mine, local_results):
        views[index].copy_(result.flatten())
    dist.all_reduce(flat, group=process_group)  # x + 0 + ... + 0 = x in any dtype: exact
    return [view.view_as(matrix) for view, matrix in zip(views, matrices)]
