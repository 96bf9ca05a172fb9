"""MARS and its AdamW fallback as multi-tensor Triton kernels: the GPU fast path of :mod:`mars.reference`.

The step is bandwidth bound, so the design counts bytes and launches, not flops:

* **Multi-tensor launches.** All tensors of a call that share (parameter dtype, gradient dtype, step) are cut
  into ``BLOCK_SIZE``-element blocks and handled by one launch per kernel. Each program finds its tensor in
  two small device tables, both cached on the host because the optimizer hands over the same tensors every
  step: a *block layout* (each tensor's length; each block's tensor and index within it), keyed by the
  lengths, and a *pointer table* (one int64 row of data pointers per role: param, grad, last_grad, ...),
  keyed by the pointers. Kernels cast a loaded pointer with ``.to(tl.pointer_type(dtype))``. The checks
  before launch are rerun only when something they read can have changed (:func:`_checked_launch_groups`).
* **Clip norm without materialising c_t.** MARS needs ||c_t||_2 per tensor before any element can be
  updated, so a step takes three launches: per-block sums of squares of c_t, a per-tensor reduction of
  those partial sums into the clip divisor max(||c_t||, 1), and the fused update. The reduction is
  deterministic (fixed order, no atomics): atomics would need the per-tensor accumulators zeroed first,
  which is a launch too, so they would save nothing and cost run-to-run reproducibility. The partial sums
  are one float per block, a negligible read next to the tensors.
* **One fused update pass** reads p, g, g_prev, m, v (and v_max) once and writes p, m, v (v_max), and with
  ``remember_grad`` also this step's gradient into g_prev, which saves the separate copy pass.

All arithmetic is float32 in the reference's order of operations, with correctly rounded division and square
root (Triton's defaults are approximate) and no fused multiply-add contraction, so float32 results agree with
the reference to rounding; that precision costs nothing in a bandwidth-bound kernel.
Launches per call: 3 per group for MARS, 1 per group for AdamW; the optimizer's tensors normally share their
dtypes and step, making a single group.
"""
import functools
import math
import operator
import weakref
from dataclasses import dataclass
from itertools import chain, repeat

import torch
from torch import Tensor

from mars.group_steps import group_steps
from mars.optimizer import as_float

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError as error:
    raise ImportError(
        "mars.triton_backend needs Triton (pip install triton, Linux only); use the torch backend without it"
    ) from error

# Elements per program of the norm and update passes (both walk the same block layout), and
# partial sums per iteration of the per-tensor reduction. Module-level so a benchmark or test can retune them.
BLOCK_SIZE = 1024
REDUCE_BLOCK_SIZE = 1024
NUM_WARPS = 4

PARAM_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# Rows of the pointer table, in this order.
ROLES = ("params", "grads", "last_grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
# Pointers that are multiples of 16 bytes and lengths that are multiples of 16 elements let the compiler use
# 16-byte vector loads and stores; the kernels state it with tl.multiple_of(..., 16) when the host checked it.
VECTOR_ALIGNMENT = 16


@triton.jit
def _block_coordinates(numels_ptr, block_tensor_ptr, block_in_tensor_ptr, ALIGNED: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr):
    """The tensor this program's block belongs to, the block's element offsets within it, and their mask."""
    block = tl.program_id(0)
    tensor = tl.load(block_tensor_ptr + block)
    numel = tl.load(numels_ptr + tensor)
    if ALIGNED:
        # A length loaded from memory has unknown divisibility, so its tail mask would defeat vectorisation in
        # every block; the host checked that every length is a multiple of 16 (VECTOR_ALIGNMENT).
        numel = tl.multiple_of(numel, 16)
    offsets = tl.load(block_in_tensor_ptr + block) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    return tensor, offsets, offsets < numel


@triton.jit
def _tensor_pointer(pointers_ptr, tensor, DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """The data pointer of ``tensor`` from one row of the pointer table, typed as DTYPE."""
    pointer = tl.load(pointers_ptr + tensor).to(tl.pointer_type(DTYPE))
    if ALIGNED:
        pointer = tl.multiple_of(pointer, 16)
    return pointer


@triton.jit
def _corrected_gradient(grad, last_grad, correction_scale):
    """c_t before clipping: g + gamma * beta1 / (1 - beta1) * (g - g_prev), in the reference's order."""
    return (grad - last_grad) * correction_scale + grad


@triton.jit
def _corrected_gradient_sum_of_squares_kernel(
    grad_pointers, last_grad_pointers, numels_ptr, block_tensor_ptr, block_in_tensor_ptr, partial_sums_ptr,
    correction_scale,
    GRAD_DTYPE: tl.constexpr, ALIGNED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """partial_sums[block] = sum of c_t^2 over the block's elements."""
    tensor, offsets, mask = _block_coordinates(numels_ptr, block_tensor_ptr, block_in_tensor_ptr, ALIGNED,
                                               BLOCK_SIZE)
    grad_ptr = _tensor_pointer(grad_pointers, tensor, GRAD_DTYPE, ALIGNED)
    last_grad_ptr = _tensor_pointer(last_grad_pointers, tensor, tl.float32, ALIGNED)
    grad = tl.load(grad_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    last_grad = tl.load(last_grad_ptr + offsets, mask=mask, other=0.0)
    corrected = _corrected_gradient(grad, last_grad, correction_scale)
    tl.store(partial_sums_ptr + tl.program_id(0), tl.sum(corrected * corrected))


@triton.jit
def _clip_divisor_kernel(partial_sums_ptr, first_block_ptr, clip_divisors_ptr, REDUCE_BLOCK_SIZE: tl.constexpr):
    """clip_divisors[tensor] = max(||c_t||_2, 1), summing the tensor's partial sums in a fixed order."""
    tensor = tl.program_id(0)
    first_block = tl.load(first_block_ptr + tensor)
    end_block = tl.load(first_block_ptr + tensor + 1)
    sums = tl.zeros([REDUCE_BLOCK_SIZE], dtype=tl.float32)
    for start in range(first_block, end_block, REDUCE_BLOCK_SIZE):
        blocks = start + tl.arange(0, REDUCE_BLOCK_SIZE)
        sums += tl.load(partial_sums_ptr + blocks, mask=blocks < end_block, other=0.0)
    norm = tl.sqrt_rn(tl.sum(sums))
    # Dividing by max(norm, 1) is the reference's `if norm > 1: c_t /= norm` without a branch: x / 1 == x.
    tl.store(clip_divisors_ptr + tensor, tl.maximum(norm, 1.0))


@triton.jit
def _fused_step_kernel(
    param_pointers, grad_pointers, last_grad_pointers, exp_avg_pointers, exp_avg_sq_pointers,
    max_exp_avg_sq_pointers, numels_ptr, block_tensor_ptr, block_in_tensor_ptr, clip_divisors_ptr,
    lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, correction_scale,
    bias_correction1, inverse_sqrt_bias_correction2,
    PARAM_DTYPE: tl.constexpr, GRAD_DTYPE: tl.constexpr, MARS_CORRECTION: tl.constexpr, LION: tl.constexpr,
    AMSGRAD: tl.constexpr, REMEMBER_GRAD: tl.constexpr, ALIGNED: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """One optimizer step on a block: MARS-AdamW, MARS-Lion, or (without MARS_CORRECTION) plain AdamW."""
    tensor, offsets, mask = _block_coordinates(numels_ptr, block_tensor_ptr, block_in_tensor_ptr, ALIGNED,
                                               BLOCK_SIZE)
    grad_ptr = _tensor_pointer(grad_pointers, tensor, GRAD_DTYPE, ALIGNED) + offsets
    grad = tl.load(grad_ptr, mask=mask).to(tl.float32)
    if MARS_CORRECTION:
        last_grad_ptr = _tensor_pointer(last_grad_pointers, tensor, tl.float32, ALIGNED) + offsets
        last_grad = tl.load(last_grad_ptr, mask=mask)
        direction = tl.div_rn(_corrected_gradient(grad, last_grad, correction_scale),
                              tl.load(clip_divisors_ptr + tensor))
        if REMEMBER_GRAD:
            tl.store(last_grad_ptr, grad, mask=mask)
    else:
        direction = grad

    exp_avg_ptr = _tensor_pointer(exp_avg_pointers, tensor, tl.float32, ALIGNED) + offsets
    exp_avg = tl.load(exp_avg_ptr, mask=mask) * beta1 + one_minus_beta1 * direction
    tl.store(exp_avg_ptr, exp_avg, mask=mask)
    if LION:
        update = tl.where(exp_avg > 0, 1.0, tl.where(exp_avg < 0, -1.0, 0.0))
    else:
        exp_avg_sq_ptr = _tensor_pointer(exp_avg_sq_pointers, tensor, tl.float32, ALIGNED) + offsets
        exp_avg_sq = tl.load(exp_avg_sq_ptr, mask=mask) * beta2 + one_minus_beta2 * direction * direction
        tl.store(exp_avg_sq_ptr, exp_avg_sq, mask=mask)
        second_moment = exp_avg_sq
        if AMSGRAD:
            max_exp_avg_sq_ptr = _tensor_pointer(max_exp_avg_sq_pointers, tensor, tl.float32, ALIGNED) + offsets
            second_moment = tl.maximum(tl.load(max_exp_avg_sq_ptr, mask=mask), exp_avg_sq)
            tl.store(max_exp_avg_sq_ptr, second_moment, mask=mask)
        denominator = (tl.sqrt_rn(second_moment) * inverse_sqrt_bias_correction2 + eps) * bias_correction1
        update = tl.div_rn(exp_avg, denominator)

    param_ptr = _tensor_pointer(param_pointers, tensor, PARAM_DTYPE, ALIGNED) + offsets
    param = tl.load(param_ptr, mask=mask).to(tl.float32)
    param = param - (param * weight_decay + update) * lr
    tl.store(param_ptr, param.to(PARAM_DTYPE), mask=mask)


@dataclass(frozen=True)
class _BlockLayout:
    """Tensors of given lengths cut into blocks, on the device, plus the norm pass's scratch buffers."""

    numels: Tensor  # int32 [num_tensors]
    first_block: Tensor  # int32 [num_tensors + 1]: tensor i owns blocks first_block[i] to first_block[i+1] - 1
    block_tensor: Tensor  # int32 [num_blocks]: the tensor each block belongs to
    block_in_tensor: Tensor  # int32 [num_blocks]: the block's index within its tensor
    partial_sums: Tensor  # float32 [num_blocks]
    clip_divisors: Tensor  # float32 [num_tensors]

    @property
    def num_tensors(self) -> int:
        return self.numels.numel()

    @property
    def num_blocks(self) -> int:
        return self.block_tensor.numel()


@functools.lru_cache(maxsize=64)
def _block_layout(device: torch.device, block_size: int, numels: tuple[int, ...]) -> _BlockLayout:
    """The block layout of tensors with these lengths, built once: it depends on nothing else."""
    numel_tensor = torch.tensor(numels, dtype=torch.int64)
    blocks_per_tensor = (numel_tensor + block_size - 1) // block_size
    first_block = torch.cat([torch.zeros(1, dtype=torch.int64), blocks_per_tensor.cumsum(0)])
    block_tensor = torch.repeat_interleave(torch.arange(len(numels)), blocks_per_tensor)
    block_in_tensor = torch.arange(block_tensor.numel()) - first_block[block_tensor]
    return _BlockLayout(
        numels=numel_tensor.to(device, torch.int32),
        first_block=first_block.to(device, torch.int32),
        block_tensor=block_tensor.to(device, torch.int32),
        block_in_tensor=block_in_tensor.to(device, torch.int32),
        partial_sums=torch.empty(block_tensor.numel(), dtype=torch.float32, device=device),
        clip_divisors=torch.empty(len(numels), dtype=torch.float32, device=device),
    )


@functools.lru_cache(maxsize=64)
def _pointer_table(device: torch.device, pointers: tuple[tuple[int, ...], ...]) -> tuple[dict[str, Tensor], bool]:
    """Role -> int64 device tensor of the data pointers (0 where a role is absent), one row of ``ROLES`` each,
    and whether every pointer is a multiple of ``VECTOR_ALIGNMENT`` bytes.

    Cached by the pointers themselves, so an entry is right for any tensors at these addresses. Gradients
    reallocated at new addresses (``zero_grad(set_to_none=True)``) cost a rebuild, which copies from pinned
    memory without waiting for the queued backward pass.
    """
    table = torch.tensor(pointers, dtype=torch.int64, pin_memory=device.type == "cuda")
    table = table.to(device, non_blocking=True)
    aligned = all(pointer % VECTOR_ALIGNMENT == 0 for row in pointers for pointer in row)
    return dict(zip(ROLES, table)), aligned


# Triton decides at kernel definition (this module's import) whether TRITON_INTERPRET=1 runs them on the CPU.
INTERPRETED = isinstance(_fused_step_kernel, InterpretedFunction)


def _check_device(device: torch.device) -> None:
    """Raise unless the kernels, as imported, can run on tensors of ``device``."""
    if device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "mars.triton_backend got CPU tensors, which Triton kernels can only touch under its interpreter: "
            "set TRITON_INTERPRET=1 before importing mars.triton_backend, or move the tensors to CUDA"
        )
    if device.type == "cuda" and INTERPRETED:
        raise RuntimeError(
            "mars.triton_backend was imported with TRITON_INTERPRET=1, whose interpreter cannot follow the "
            "kernels' pointer tables into GPU memory: import it without TRITON_INTERPRET, or use CPU tensors"
        )
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        raise RuntimeError(
            f"mars.triton_backend got tensors on {device} but Triton launches on the current device "
            f"cuda:{torch.cuda.current_device()}: call torch.cuda.set_device({device.index}) first"
        )
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"mars.triton_backend runs on CUDA tensors (or CPU under the interpreter), got {device}")


def _check_lengths(params: list[Tensor], grads: list[Tensor], state: dict[str, list[Tensor]], steps: list[int]) -> None:
    """Raise unless every list has one entry per param."""
    for name, values in (("grads", grads), ("steps", steps), *state.items()):
        if values is None or len(values) != len(params):
            raise ValueError(f"{name} must have one entry per param ({len(params)}), got "
                             f"{'None' if values is None else len(values)}")


def _check_steps(steps: list[int]) -> None:
    """Raise unless every step counts from 1: the bias corrections divide by 1 - beta**step."""
    if min(steps) < 1:
        i = steps.index(min(steps))
        raise ValueError(f"steps[{i}] is {steps[i]}; steps count from 1 (increment before the update)")


TensorMetadata = tuple[torch.Size, torch.dtype, torch.device]
# What the checks read of a tensor, with its contiguity; the launches need nothing else of it but its address.
_SHAPE_DTYPE_DEVICE = operator.attrgetter("shape", "dtype", "device")


def _metadata(tensors: list[Tensor]) -> tuple[tuple[TensorMetadata, ...], tuple[bool, ...]]:
    """What the checks read of each tensor: (shape, dtype, device), and whether it is contiguous."""
    return tuple(map(_SHAPE_DTYPE_DEVICE, tensors)), tuple(map(Tensor.is_contiguous, tensors))


def _check_metadata(metadata: dict[str, tuple[tuple[TensorMetadata, ...], tuple[bool, ...]]], block_size: int) -> None:
    """Raise on any input the kernels would misread: they see raw pointers, so nothing is converted for them.

    ``metadata`` holds :func:`_metadata` of each list: params, grads, then the state roles.
    """
    (params, _), (grads, _) = metadata["params"], metadata["grads"]
    device = params[0][2]
    for i, ((shape, param_dtype, _), (_, grad_dtype, _)) in enumerate(zip(params, grads)):
        if param_dtype not in PARAM_DTYPES:
            raise TypeError(f"params[{i}] has dtype {param_dtype}; supported: {list(PARAM_DTYPES)}")
        if grad_dtype not in (param_dtype, torch.float32):
            raise TypeError(f"grads[{i}] has dtype {grad_dtype}; it must be its param's dtype ({param_dtype}) "
                            f"or float32")
        for name, (tensors, contiguous) in metadata.items():
            tensor_shape, dtype, tensor_device = tensors[i]
            if tensor_device != device:
                raise ValueError(f"{name}[{i}] is on {tensor_device}, params[0] on {device}: use one device")
            if tensor_shape != shape:
                raise ValueError(f"{name}[{i}] has shape {tuple(tensor_shape)}, its param {tuple(shape)}")
            if not contiguous[i]:
                raise ValueError(f"{name}[{i}] is not contiguous: the kernels walk raw memory; pass .contiguous()")
            if name not in ("params", "grads") and dtype != torch.float32:
                raise TypeError(f"{name}[{i}] has dtype {dtype}; optimizer state must be float32")
        if shape.numel() > 2**31 - block_size:
            raise ValueError(f"params[{i}] has {shape.numel()} elements; the kernels index elements with int32, "
                             f"so at most 2**31 - BLOCK_SIZE")


@dataclass(frozen=True)
class _LaunchGroup:
    """Tensors of a call that one launch per kernel steps: they share parameter dtype, gradient dtype and step."""

    indices: tuple[int, ...]  # positions in the call's lists, ascending
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    layout: _BlockLayout
    aligned_numels: bool  # every length a multiple of VECTOR_ALIGNMENT


def _launch_groups(metadata: dict[str, tuple[tuple[TensorMetadata, ...], tuple[bool, ...]]],
                   step_offsets: tuple[int, ...], block_size: int) -> tuple[_LaunchGroup, ...]:
    """Check a call's inputs (:func:`_check_metadata`) and split them into launch groups.

    ``step_offsets`` holds each tensor's step minus the first tensor's. Groups of only zero-element tensors are
    left out: they have nothing to launch.
    """
    _check_metadata(metadata, block_size)
    (params, _), (grads, _) = metadata["params"], metadata["grads"]
    members: dict[tuple[torch.dtype, torch.dtype, int], list[int]] = {}
    for i, ((_, param_dtype, _), (_, grad_dtype, _), step_offset) in enumerate(zip(params, grads, step_offsets)):
        members.setdefault((param_dtype, grad_dtype, step_offset), []).append(i)
    groups = []
    for (param_dtype, grad_dtype, _), indices in members.items():
        numels = tuple(params[i][0].numel() for i in indices)
        layout = _block_layout(params[0][2], block_size, numels)
        if layout.num_blocks > 0:
            aligned_numels = all(numel % VECTOR_ALIGNMENT == 0 for numel in numels)
            groups.append(_LaunchGroup(tuple(indices), param_dtype, grad_dtype, layout, aligned_numels))
    return tuple(groups)


@dataclass(frozen=True)
class _CheckedCall:
    """A call whose inputs passed the checks, and its launch groups (see :func:`_checked_launch_groups`)."""

    state: tuple[weakref.ref, ...]  # its state tensors, every role's in turn
    params_and_grads: tuple  # (_metadata(params), _metadata(grads))
    step_offsets: tuple[int, ...]
    block_size: int
    groups: tuple[_LaunchGroup, ...]


# Recent calls that passed the checks, by their state tensors' roles and addresses: one per batch of an
# optimizer's tensors, two in MARS's exact scheme (whose last_grad buffers trade places every step).
_checked_calls: dict[tuple, _CheckedCall] = {}
_MAX_CHECKED_CALLS = 64


def _checked_launch_groups(tensors: dict[str, list[Tensor]], pointers: dict[str, tuple[int, ...]],
                           step_offsets: tuple[int, ...]) -> tuple[_LaunchGroup, ...]:
    """:func:`_launch_groups` of a call's ``tensors`` (params, grads, then the state roles), rerun only when
    something the checks read can have changed since a call that passed them. What proves it unchanged:

    * params and grads: their shapes, dtypes, devices and contiguity, read every call. Gradients are new
      tensors every step, and a parameter can change in place (``param.data = x``) keeping its identity, its
      address and its version counter (``p.data = p.data.t()``): nothing cheaper would prove them unchanged.
    * state tensors: the same objects (held by weak reference, so that a new tensor reusing an id is not taken
      for the old one) at the same addresses. The optimizer's state is replaced (``load_state_dict``,
      ``state[p][key] = x``), moved (``.data = x.to(device)``: a new address), never reshaped or retyped where
      it lies, so the same object at the same address still reads as it was checked. A state tensor changed
      in place at its address (``.t_()``, ``.data =`` a view of itself) is the one change not rechecked.
    * which tensors share a step, and the block size.
    """
    state_names = tuple(tensors)[2:]
    state = tuple(chain.from_iterable(tensors[name] for name in state_names))
    key = (state_names, tuple(chain.from_iterable(pointers[name] for name in state_names)))
    params_and_grads = (_metadata(tensors["params"]), _metadata(tensors["grads"]))
    checked = _checked_calls.get(key)
    if (checked is not None and checked.params_and_grads == params_and_grads
            and checked.step_offsets == step_offsets and checked.block_size == BLOCK_SIZE
            and all(map(operator.is_, map(operator.call, checked.state), state))):
        return checked.groups
    metadata = dict(zip(("params", "grads"), params_and_grads))
    metadata.update((name, _metadata(tensors[name])) for name in state_names)
    groups = _launch_groups(metadata, step_offsets, BLOCK_SIZE)
    if len(_checked_calls) >= _MAX_CHECKED_CALLS:
        del _checked_calls[next(iter(_checked_calls))]
    _checked_calls[key] = _CheckedCall(tuple(map(weakref.ref, state)), params_and_grads, step_offsets, BLOCK_SIZE,
                                       groups)
    return groups


def _launch(
    group: _LaunchGroup,
    pointer_table: dict[str, Tensor],
    *,
    aligned: bool,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    gamma: float | None,
    lion: bool,
    amsgrad: bool,
    remember_grad: bool,
) -> None:
    """The launches of one group: norm pass, clip divisors and update for MARS, the update alone for AdamW."""
    layout = group.layout
    blocks = layout.numels, layout.block_tensor, layout.block_in_tensor
    mars_correction = gamma is not None
    correction_scale = gamma * (beta1 / (1.0 - beta1)) if mars_correction else 0.0
    if mars_correction:
        _corrected_gradient_sum_of_squares_kernel[(layout.num_blocks,)](
            pointer_table["grads"], pointer_table["last_grad"], *blocks, layout.partial_sums, correction_scale,
            GRAD_DTYPE=PARAM_DTYPES[group.grad_dtype], ALIGNED=aligned, BLOCK_SIZE=BLOCK_SIZE,
            num_warps=NUM_WARPS, enable_fp_fusion=False,
        )
        _clip_divisor_kernel[(layout.num_tensors,)](
            layout.partial_sums, layout.first_block, layout.clip_divisors, REDUCE_BLOCK_SIZE=REDUCE_BLOCK_SIZE,
            num_warps=NUM_WARPS, enable_fp_fusion=False,
        )
    _fused_step_kernel[(layout.num_blocks,)](
        *(pointer_table[role] for role in ROLES), *blocks, layout.clip_divisors,
        lr, beta1, beta2, 1.0 - beta1, 1.0 - beta2, eps, weight_decay, correction_scale,
        1.0 - beta1**step, 1.0 / math.sqrt(1.0 - beta2**step),
        PARAM_DTYPE=PARAM_DTYPES[group.param_dtype], GRAD_DTYPE=PARAM_DTYPES[group.grad_dtype],
        MARS_CORRECTION=mars_correction, LION=lion, AMSGRAD=amsgrad, REMEMBER_GRAD=remember_grad,
        ALIGNED=aligned, BLOCK_SIZE=BLOCK_SIZE, num_warps=NUM_WARPS, enable_fp_fusion=False,
    )


# Run eagerly inside a compiled step (the optimizer runs the whole group so, mars.optimizer's _step_group_eagerly): the
# launch reads the tensors' data pointers into its tables, which traced (fake) tensors do not have.
@torch.compiler.disable
def _fused_step(
    params: list[Tensor],
    grads: list[Tensor],
    state: dict[str, list[Tensor]],
    *,
    steps: list[int],
    **hyperparameters,
) -> None:
    """Launch the kernels once per (param dtype, grad dtype, step) group; ``gamma=None`` means plain AdamW.

    ``hyperparameters`` are :func:`_launch`'s. The inputs are checked (:func:`_checked_launch_groups`) before
    anything is launched.
    """
    if not params:
        return
    hyperparameters["lr"] = as_float(hyperparameters["lr"])  # a tensor lr of a traced step (mars.optimizer.step_lr)
    steps = [int(step) for step in steps]  # a traced step counts in tensors (mars.step_count)
    _check_lengths(params, grads, state, steps)
    _check_steps(steps)
    device = params[0].device
    _check_device(device)  # every call: it also depends on the current CUDA device and on the interpreter
    tensors = {"params": params, "grads": grads, **state}
    pointers = {name: tuple(map(Tensor.data_ptr, values)) for name, values in tensors.items()}
    groups = _checked_launch_groups(tensors, pointers, tuple(map(operator.sub, steps, repeat(steps[0]))))
    for group in groups:
        rows = tuple(
            _at(pointers[role], group.indices) if role in pointers else (0,) * len(group.indices) for role in ROLES
        )
        pointer_table, aligned_pointers = _pointer_table(device, rows)
        _launch(group, pointer_table, aligned=aligned_pointers and group.aligned_numels,
                step=steps[group.indices[0]], **hyperparameters)


def _at(values: tuple[int, ...], indices: tuple[int, ...]) -> tuple[int, ...]:
    """``values`` at ascending distinct ``indices``: all of them when there are as many indices as values."""
    return values if len(indices) == len(values) else tuple(values[i] for i in indices)


mars_group_step, adamw_group_step = group_steps(_fused_step, "Triton")
