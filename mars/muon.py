"""Muon, the baseline of the MARS paper, as its authors ran it (AGI-Arena/MARS ``optimizers/muon.py``,
adapted from KellerJordan/modded-nanogpt), with their AdamW for the tensors that are not 2-D in the same object."""
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mars import muon_foreach, reference
from mars.cuda_graph import CudaGraphedNewtonSchulz
from mars.newton_schulz import check_ns_form, orthogonalise
from mars.optimizer import (
    advance_steps,
    check_newton_schulz_group,
    check_non_negative,
    DispatchingOptimizer,
    each_tensor,
    following_rate,
    state_buffers,
    step_lr,
)

ADAMW_VARIANTS = ("authors", "torch")
UPDATE_DTYPES = (torch.bfloat16, torch.float32)


class Muon(CudaGraphedNewtonSchulz, DispatchingOptimizer):
    r"""MomentUm Orthogonalized by Newton-Schulz (Jordan et al., 2024), the Muon baseline of arXiv 2411.10438.

    For a 2-D tensor with gradient :math:`g_t` (rows x cols):

    .. math::
        b_t &= \mu b_{t-1} + g_t \\
        d_t &= g_t + \mu b_t \ \text{(nesterov)} \quad\text{or}\quad d_t = b_t \\
        u_t &= \mathrm{round}\big(\mathrm{NS}_k(d_t) \sqrt{\max(1, rows/cols)}\big) \\
        x_{t+1} &= x_t (1 - \eta_t \lambda) - \eta_t u_t

    where :math:`\mathrm{NS}_k` is :func:`mars.reference.newton_schulz5` with ``ns_steps`` iterations in
    ``ns_dtype`` (the authors' bfloat16 by default; float32 is ~10x faster on CPUs without bfloat16 units) and
    round is to ``update_dtype``. Other tensors take AdamW with ``adamw_betas``, ``adamw_eps``,
    ``adamw_weight_decay`` and learning rate ``adamw_lr``, which follows the group's lr: the group keeps
    ``adamw_lr_ratio = adamw_lr / lr`` from its creation and steps at that ratio times its current lr, so any torch
    scheduler on ``lr`` schedules both (the trainer sets the ratio each step to schedule each part from its own peak
    to the same min_lr, as the authors' trainer does: ``training.schedule.apply_schedule``). State is float32 for
    bfloat16/float16/float32 parameters, float64 for float64 ones (whose updates are computed in float64; the
    orthogonalised update is still rounded to ``update_dtype``).

    A param group may set any hyperparameter of its own, and takes the constructor's for the others (a group that
    sets ``lr`` keeps the constructor's ``adamw_lr``, as its ratio to the group's own lr); ``process_group``,
    ``ns_cuda_graph``, ``ns_batch`` and ``foreach`` hold for the whole optimizer and are refused in a group. ``lr``
    and ``adamw_lr`` may be 1-element tensors, read as floats once per step (``adamw_lr`` when the group is created,
    or when it is written into the group between steps).

    Two options default to the authors' (``MARS/train_muon.py:209-217`` combines their ``optimizers/adamw.py``
    and ``optimizers/muon.py``); ``adamw_variant="torch"`` and ``update_dtype=torch.float32`` give torch's AdamW
    and float32 updates instead:

    * ``adamw_variant="authors"``: their AdamW (:func:`mars.reference.authors_adamw_step`), whose eps is added to
      the uncorrected :math:`\sqrt{v_t}` and whose weight decay is scaled by the bias-corrected step size
      (``adamw.py:112-122``); ``"torch"``: torch's AdamW (:func:`mars.reference.adamw_step`).
    * ``update_dtype=torch.bfloat16``: as their Muon, Newton-Schulz normalises the ``ns_dtype`` copy of
      :math:`d_t` by its own norm (``muon.py:26-27``), and the update is scaled and rounded in bfloat16 before it
      is applied in float32 (``muon.py:87,104-116``); ``torch.float32`` normalises by the float32 norm of
      :math:`d_t` and keeps the update float32. (Their Newton-Schulz ran under ``torch.compile``, whose fused
      kernels may round bfloat16 differently; this one runs eager, op by op as their code reads.)

    ``ns_form`` is the product order of the iteration (:data:`mars.newton_schulz.NS_FORMS`): the authors'
    ``"products"`` by default; ``"fused_gram"`` costs fewer flops and kernels and rounds less (about half the
    authors' bfloat16 error against float64), the same polynomial. Under DDP, pass ``process_group`` (every rank must
    hold the same gradients): each rank then orthogonalises a share of the matrices, balanced by cost, and one
    all-reduce of an ``update_dtype`` buffer gives everyone every update, as the authors' multi-GPU code does
    with bfloat16 (``muon.py:87-110``). Adding zeros is exact, so N ranks step exactly as one process does.
    The group is held weakly (:class:`mars.optimizer.WeakProcessGroup`): Muon does not keep it alive.
    ``ns_cuda_graph=True`` (CUDA only) runs each group's Newton-Schulz as one CUDA graph, the same kernels without
    a launch each (:class:`mars.cuda_graph.CapturedLists`; it holds a copy of the matrices and their results).
    ``ns_batch=True`` orthogonalises the matrices of one shape together, as one batch of products (fewer, larger
    kernels), each normalised by its own norm: on the CPU bit for bit what one matrix at a time gives (tested); on
    CUDA a batched product may round otherwise. Off by default, the authors' one matrix at a time.
    ``foreach`` (None, the default, or True) steps the elementwise part (momentum, the scaled update, the authors'
    AdamW) of each group's tensors together with ``torch._foreach_*`` ops (:mod:`mars.muon_foreach`: a few launches
    per operation instead of one per tensor); False steps them tensor by tensor (:data:`PER_TENSOR`). The two give
    the same results, on the CPU bit for bit. torch's AdamW (``adamw_variant="torch"``) runs tensor by tensor.
    """

    OPTIMIZER_OPTIONS = ("process_group", "ns_cuda_graph", "ns_batch", "foreach")
    LEARNING_RATES = ("lr", "adamw_lr")
    FOLLOWING_LRS = ("adamw_lr",)

    def __init__(
        self,
        params,
        lr: float = 0.02,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        weight_decay: float = 0.0,
        adamw_lr: float = 3e-3,
        adamw_betas: tuple[float, float] = (0.9, 0.95),
        adamw_eps: float = 1e-8,
        adamw_weight_decay: float = 0.1,
        ns_dtype: torch.dtype = torch.bfloat16,
        process_group: dist.ProcessGroup | None = None,
        adamw_variant: str = "authors",
        update_dtype: torch.dtype = torch.bfloat16,
        ns_form: str = "products",
        ns_cuda_graph: bool = False,
        foreach: bool | None = None,
        ns_batch: bool = False,
    ):
        defaults = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, weight_decay=weight_decay,
            adamw_lr=adamw_lr, adamw_betas=adamw_betas, adamw_eps=adamw_eps,
            adamw_weight_decay=adamw_weight_decay, ns_dtype=ns_dtype, adamw_variant=adamw_variant,
            update_dtype=update_dtype, ns_form=ns_form,
        )
        super().__init__(params, defaults, process_group=process_group, ns_cuda_graph=ns_cuda_graph, ns_batch=ns_batch,
                         foreach=foreach)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_non_negative(
            weight_decay=group["weight_decay"], adamw_eps=group["adamw_eps"],
            adamw_weight_decay=group["adamw_weight_decay"],
        )
        check_newton_schulz_group(group)
        if group["adamw_variant"] not in ADAMW_VARIANTS:
            raise ValueError(f"adamw_variant must be one of {ADAMW_VARIANTS}, got {group['adamw_variant']!r}")
        if group["update_dtype"] not in UPDATE_DTYPES:
            raise ValueError(f"update_dtype must be torch.bfloat16 (the authors') or torch.float32, "
                             f"got {group['update_dtype']!r}")
        # Muon normalises in ns_dtype exactly when its updates are bfloat16 (see _matrix_step).
        check_ns_form(group["ns_form"], norm_in_dtype=group["update_dtype"] == torch.bfloat16)

    def _rules(self) -> ModuleType | SimpleNamespace:
        """The list functions that step the tensors: foreach ops unless ``foreach=False``."""
        return muon_foreach if self.foreach is not False else PER_TENSOR

    def _matrix_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """Orthogonalised (Nesterov) momentum step of a group's 2-D tensors."""
        rules = self._rules()
        states = self._states(params)
        directions = rules.muon_directions([param.grad for param in params],
                                           state_buffers(params, states, "momentum_buffer"),
                                           momentum=group["momentum"], nesterov=group["nesterov"])
        update_dtype = group["update_dtype"]
        orthogonalised = orthogonalise(directions, group["ns_steps"], group["ns_dtype"], self.process_group,
                                       norm_in_dtype=update_dtype == torch.bfloat16, out_dtype=update_dtype,
                                       form=group["ns_form"], batch=self.ns_batch,
                                       graph=self._newton_schulz_graph(group))
        rules.apply_muon_updates(params, orthogonalised, lr=step_lr(group["lr"]), weight_decay=group["weight_decay"])

    def _adamw_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """AdamW step (the authors' or torch's) of a group's tensors that are not 2-D."""
        states = self._states(params)
        exp_avgs, exp_avg_sqs = state_buffers(params, states, "exp_avg"), state_buffers(params, states, "exp_avg_sq")
        beta1, beta2 = group["adamw_betas"]
        hyper = dict(steps=advance_steps(params, states), lr=following_rate(group, "adamw_lr"), beta1=beta1,
                     beta2=beta2, eps=group["adamw_eps"], weight_decay=group["adamw_weight_decay"])
        grads = [param.grad for param in params]
        if group["adamw_variant"] == "authors":
            self._rules().authors_adamw_steps(params, grads, exp_avgs, exp_avg_sqs, **hyper)
        else:
            _torch_adamw_steps(params, grads, exp_avgs, exp_avg_sqs, **hyper)


def apply_muon_update(param: Tensor, update: Tensor, *, lr: float, weight_decay: float) -> None:
    """The authors' update of one matrix (``muon.py:87,104-116``): the orthogonalised ``update`` scaled in place, in
    its own dtype, by sqrt(max(1, rows / cols)); then p <- p (1 - lr * weight_decay) - lr * update in float32 (float64
    for a float64 p)."""
    shape_scale = max(1.0, param.size(0) / param.size(1)) ** 0.5
    work = param.to(reference.working_dtype(param))
    reference.add_scaled_(work.mul_(1.0 - lr * weight_decay), update.mul_(shape_scale).to(work.dtype), -lr)
    param.copy_(work)


def _authors_adamw_steps(params, grads, exp_avgs, exp_avg_sqs, *, steps: list[int], **hyper) -> None:
    """:func:`mars.reference.authors_adamw_step` tensor by tensor, each at its own ``steps[i]``."""
    for param, grad, exp_avg, exp_avg_sq, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        reference.authors_adamw_step(param, grad, exp_avg, exp_avg_sq, step=step, **hyper)


def _torch_adamw_steps(params, grads, exp_avgs, exp_avg_sqs, *, steps: list[int], **hyper) -> None:
    """torch's AdamW (:func:`mars.reference.adamw_step`), tensor by tensor on either path: the option that is not
    the authors' keeps its reference form."""
    for param, grad, exp_avg, exp_avg_sq, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        reference.adamw_step(param, grad, exp_avg, exp_avg_sq, None, step=step, **hyper, amsgrad=False)


# The per-tensor path: the functions of mars.muon_foreach, one tensor at a time.
PER_TENSOR = SimpleNamespace(
    muon_directions=each_tensor(reference.moonlight_direction),
    apply_muon_updates=each_tensor(apply_muon_update),
    authors_adamw_steps=_authors_adamw_steps,
)
