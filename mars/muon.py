"""Muon, the baseline of the MARS paper, as its authors ran it (AGI-Arena/MARS ``optimizers/muon.py``,
adapted from KellerJordan/modded-nanogpt), with their AdamW for the tensors that are not 2-D in the same object."""
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mars import reference
from mars.cuda_graph import CapturedLists, CudaGraphedNewtonSchulz
from mars.newton_schulz import check_ns_form, orthogonalise
from mars.optimizer import (
    check_betas,
    check_flags,
    check_ns_dtype,
    check_non_negative,
    check_real_params,
    float32_zeros_like,
    Float32StateOptimizer,
    WeakProcessGroup,
)

ADAMW_VARIANTS = ("authors", "torch")
UPDATE_DTYPES = (torch.bfloat16, torch.float32)


class Muon(CudaGraphedNewtonSchulz, Float32StateOptimizer):
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
    ``adamw_weight_decay`` and learning rate :math:`\eta_t \cdot` ``adamw_lr / lr``, so one schedule on
    ``group['lr']`` drives both (the trainer instead updates ``adamw_lr_ratio`` every step so that both parts decay
    to the same min_lr, as the authors' trainer does: ``training.schedule.apply_schedule``). State is float32
    whatever the parameter dtype.

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
    """

    process_group = WeakProcessGroup()
    ADDED_OPTIONS = ("adamw_variant", "update_dtype", "ns_form")

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
    ):
        if not lr > 0.0:
            raise ValueError(f"lr must be > 0 (adamw_lr is applied as the ratio adamw_lr / lr), got {lr!r}")
        check_non_negative(adamw_lr=adamw_lr)
        check_flags(ns_cuda_graph=ns_cuda_graph)
        defaults = dict(
            lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps, weight_decay=weight_decay,
            adamw_lr_ratio=adamw_lr / lr, adamw_betas=adamw_betas, adamw_eps=adamw_eps,
            adamw_weight_decay=adamw_weight_decay, ns_dtype=ns_dtype, adamw_variant=adamw_variant,
            update_dtype=update_dtype, ns_form=ns_form,
        )
        super().__init__(params, defaults)
        # Not a hyperparameter: kept out of param_groups, which state_dict() saves.
        self.process_group = process_group
        self.ns_cuda_graph = ns_cuda_graph
        self._check_ns_cuda_graph_devices()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group after checking its hyperparameters (defaults filled in) and its parameters."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        check_real_params(group["params"], "Muon")
        check_non_negative(
            lr=group["lr"], weight_decay=group["weight_decay"], adamw_eps=group["adamw_eps"],
            adamw_weight_decay=group["adamw_weight_decay"],
        )
        if not 0.0 <= group["momentum"] < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {group['momentum']!r}")
        if not (isinstance(group["ns_steps"], int) and group["ns_steps"] >= 1):
            raise ValueError(f"ns_steps must be an int >= 1, got {group['ns_steps']!r}")
        check_betas("adamw_betas", group["adamw_betas"])
        check_ns_dtype(group["ns_dtype"])
        if group["adamw_variant"] not in ADAMW_VARIANTS:
            raise ValueError(f"adamw_variant must be one of {ADAMW_VARIANTS}, got {group['adamw_variant']!r}")
        if group["update_dtype"] not in UPDATE_DTYPES:
            raise ValueError(f"update_dtype must be torch.bfloat16 (the authors') or torch.float32, "
                             f"got {group['update_dtype']!r}")
        # Muon normalises in ns_dtype exactly when its updates are bfloat16 (see _muon_step).
        check_ns_form(group["ns_form"], norm_in_dtype=group["update_dtype"] == torch.bfloat16)

    @torch.no_grad()
    def step(self, closure=None):
        """One step on every parameter that has a gradient; returns the closure's loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group_index, group in enumerate(self.param_groups):
            matrices = []
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("Muon does not support sparse gradients; use dense gradients for this parameter")
                if param.dim() == 2:
                    matrices.append(param)
                else:
                    self._adamw_step(param, group)
            if matrices:
                self._muon_step(matrices, group, self._newton_schulz_graph(group_index))
        return loss

    def __getstate__(self) -> dict[str, Any]:
        # Optimizer.__getstate__ keeps only defaults, state and groups; the option survives a copy or pickle.
        return {**super().__getstate__(), "ns_cuda_graph": self.ns_cuda_graph}

    def _muon_step(self, params: list[Tensor], group: dict[str, Any], graph: CapturedLists | None) -> None:
        """Orthogonalised (Nesterov) momentum step of a group's 2-D tensors."""
        directions = []
        for param in params:
            state = self.state[param]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = float32_zeros_like(param)
            momentum_buffer = state["momentum_buffer"]
            grad = param.grad.float()
            momentum_buffer.mul_(group["momentum"]).add_(grad)
            directions.append(grad.add(momentum_buffer, alpha=group["momentum"]) if group["nesterov"]
                              else momentum_buffer)
        update_dtype = group["update_dtype"]
        orthogonalised = orthogonalise(directions, group["ns_steps"], group["ns_dtype"], self.process_group,
                                       norm_in_dtype=update_dtype == torch.bfloat16, out_dtype=update_dtype,
                                       form=group["ns_form"], graph=graph)
        lr = group["lr"]
        for param, update in zip(params, orthogonalised):
            shape_scale = max(1.0, param.size(0) / param.size(1)) ** 0.5
            param32 = param.float()
            param32.mul_(1.0 - lr * group["weight_decay"]).add_(update.mul_(shape_scale).float(), alpha=-lr)
            param.copy_(param32)

    def _adamw_step(self, param: Tensor, group: dict[str, Any]) -> None:
        """AdamW step (the authors' or torch's) of one tensor that is not 2-D."""
        state = self.state[param]
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in state:
                state[key] = float32_zeros_like(param)
        state["step"] = state.get("step", 0) + 1
        beta1, beta2 = group["adamw_betas"]
        hyper = dict(step=state["step"], lr=group["lr"] * group["adamw_lr_ratio"], beta1=beta1, beta2=beta2,
                     eps=group["adamw_eps"], weight_decay=group["adamw_weight_decay"])
        if group["adamw_variant"] == "authors":
            reference.authors_adamw_step(param, param.grad, state["exp_avg"], state["exp_avg_sq"], **hyper)
        else:
            reference.adamw_step(param, param.grad, state["exp_avg"], state["exp_avg_sq"], None, **hyper,
                                 amsgrad=False)
