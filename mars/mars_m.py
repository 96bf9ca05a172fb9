"""MARS-M (Liu, Yuan & Gu, 2025, arXiv 2510.21800) and its Moonlight baseline (Muon scaled as in arXiv 2502.16982)
as ``torch.optim`` optimizers, following the MARS-M authors' code (AGI-Arena/MARS ``MARS_M/optimizers/``).

The update rules live in :mod:`mars.reference`; these classes gather each group's tensors, orthogonalise the
matrices' directions together (:func:`mars.newton_schulz.orthogonalise`) and apply the rules, either tensor by
tensor (:data:`PER_TENSOR`, the reference's functions in a loop) or to whole lists at once
(:mod:`mars.mars_m_foreach`, the same operations as ``torch._foreach_*`` ops).
"""
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mars import mars_m_foreach, reference
from mars.cuda_graph import CudaGraphedNewtonSchulz
from mars.newton_schulz import check_ns_form, orthogonalise
from mars.optimizer import (
    advance_steps,
    check_flags,
    check_newton_schulz_group,
    check_non_negative,
    DispatchingOptimizer,
    each_tensor,
    LookaheadGradient,
    state_buffers,
    step_lr,
)


def _mars_m_momenta(grads, last_grads, momentum_buffers, *, remember_grad: bool, **hyper) -> list[Tensor]:
    """:func:`mars.reference.mars_m_momentum` tensor by tensor; with ``remember_grad``, then g_prev <- g."""
    momenta = each_tensor(reference.mars_m_momentum)(grads, last_grads, momentum_buffers, **hyper)
    if remember_grad:
        for last_grad, grad in zip(last_grads, grads):
            last_grad.copy_(grad)
    return momenta


def _mars_m_adamw_steps(params, grads, exp_avgs, exp_avg_sqs, *, steps: list[int], **hyper) -> None:
    """:func:`mars.reference.mars_m_adamw_step` tensor by tensor, each at its own ``steps[i]``."""
    for param, grad, exp_avg, exp_avg_sq, step in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
        reference.mars_m_adamw_step(param, grad, exp_avg, exp_avg_sq, step=step, **hyper)


# The per-tensor path: the functions of mars.mars_m_foreach, computed by mars.reference one tensor at a time.
PER_TENSOR = SimpleNamespace(
    mars_m_momenta=_mars_m_momenta,
    mars_m_efficient_directions=each_tensor(reference.mars_m_efficient_direction),
    moonlight_directions=each_tensor(reference.moonlight_direction),
    apply_shape_scaled_updates=each_tensor(reference.apply_shape_scaled_update),
    mars_m_adamw_steps=_mars_m_adamw_steps,
)


class _ShapeScaledOrthogonal(CudaGraphedNewtonSchulz, DispatchingOptimizer):
    """What MarsM, MarsMEfficient and Moonlight share: every 2-D tensor of a group with ``matrix_rule`` steps by
    its orthogonalised direction (the subclass's :meth:`_directions`), scaled by 0.2 sqrt(max(A, B))
    (:func:`mars.reference.apply_shape_scaled_update`); every other tensor takes the authors' AdamW
    (:func:`mars.reference.mars_m_adamw_step`) with the group's lr and weight decay."""

    OPTIMIZER_OPTIONS = ("process_group", "foreach", "ns_cuda_graph", "ns_batch")
    RULE_KEYS = ("matrix_rule",)

    def _base_arguments(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """A subclass constructor's arguments (its ``locals()``) as :class:`DispatchingOptimizer` takes them: the
        options of the whole optimizer (``OPTIMIZER_OPTIONS``) by name, the others as the param groups'
        ``defaults``."""
        defaults = {key: value for key, value in arguments.items() if key not in ("self", "params", "__class__")}
        return {key: defaults.pop(key) for key in self.OPTIMIZER_OPTIONS} | {"defaults": defaults}

    def _check_group(self, group: dict[str, Any]) -> None:
        # gamma, clip_c and nesterov: the options of some of the rules, checked where the group has them.
        check_non_negative(**{key: group[key] for key in ("weight_decay", "adamw_eps", "gamma") if key in group})
        check_newton_schulz_group(group)
        check_ns_form(group["ns_form"], norm_in_dtype=True)  # the authors normalise in ns_dtype
        check_flags(**{key: group[key] for key in ("matrix_rule", "clip_c", "nesterov") if key in group})

    def _rule(self, param: Tensor, group: dict[str, Any]) -> str:
        return "matrices" if group["matrix_rule"] and param.dim() == 2 else "others"

    def _rules(self) -> ModuleType | SimpleNamespace:
        """The list functions that step the tensors: foreach ops unless ``foreach=False`` (None takes them on every
        device, see the option in MarsM's docstring), else the reference tensor by tensor."""
        return mars_m_foreach if self.foreach is not False else PER_TENSOR

    def _directions(self, params: list[Tensor], states: list[dict[str, Any]], group: dict[str, Any],
                    rules) -> list[Tensor]:
        """The matrices whose orthogonalisations are ``params``' updates, by ``rules``; advances their ``states``."""
        raise NotImplementedError

    def _matrix_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """Orthogonalise the directions of a group's matrices and apply them."""
        rules = self._rules()
        directions = self._directions(params, self._states(params), group, rules)
        ns_dtype = group["ns_dtype"]
        # The authors' Newton-Schulz: the ns_dtype copy normalised by its own norm with a fixed eps, the polynomial
        # in the Gram matrix formed first (mars_m.py:19-30), in the product order ns_form ("gram": theirs). The
        # results stay in ns_dtype, where they are exact: bfloat16 halves the bytes all-reduced under DDP, and
        # float64 ones reach float64 parameters unrounded.
        updates = orthogonalise(directions, group["ns_steps"], ns_dtype, self.process_group,
                                eps=reference.MARS_M_NEWTON_SCHULZ_EPS, norm_in_dtype=True, out_dtype=ns_dtype,
                                form=group["ns_form"], batch=self.ns_batch, graph=self._newton_schulz_graph(group))
        rules.apply_shape_scaled_updates(params, updates, lr=step_lr(group["lr"]),
                                         weight_decay=group["weight_decay"])

    def _adamw_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """The authors' AdamW step of the tensors that take no matrix rule."""
        states = self._states(params)
        beta1, beta2 = group["adamw_betas"]
        self._rules().mars_m_adamw_steps(
            params, [param.grad for param in params], state_buffers(params, states, "exp_avg"),
            state_buffers(params, states, "exp_avg_sq"), steps=advance_steps(params, states), lr=step_lr(group["lr"]),
            beta1=beta1, beta2=beta2, eps=group["adamw_eps"], weight_decay=group["weight_decay"])


class MarsM(LookaheadGradient, _ShapeScaledOrthogonal):
    r"""MARS-M: MARS variance reduction on Moonlight's orthogonalised momentum (arXiv 2510.21800, Algorithm 2).

    For a 2-D tensor (A x B) of a group with ``matrix_rule``, with gradient :math:`g_t` and remembered gradient
    :math:`\tilde g_{t-1}` (zeros at the first step):

    .. math::
        c_t &= g_t + \gamma \tfrac{\beta}{1-\beta} (g_t - \tilde g_{t-1}),
               \qquad c_t \leftarrow c_t / \|c_t\|_F \text{ if } \|c_t\|_F > 1 \text{ (clip\_c)} \\
        m_t &= \beta m_{t-1} + (1-\beta) c_t \\
        x_{t+1} &= x_t (1 - \eta_t \lambda) - \eta_t \cdot 0.2 \sqrt{\max(A, B)}\ \mathrm{NS}_k(m_t)

    (:func:`mars.reference.mars_m_step`). :math:`\mathrm{NS}_k` is Newton-Schulz with ``ns_steps`` iterations in
    ``ns_dtype``, normalised as the authors' (the ``ns_dtype`` copy by its own norm, eps 1e-7); it runs through
    :func:`mars.newton_schulz.orthogonalise` in the authors' product order, b A + c A A formed first
    (``form="gram"``, :func:`mars.reference.newton_schulz5_gram_polynomial`).

    Every other tensor (not 2-D, or in a group with ``matrix_rule=False``: the authors' embeddings and lm_head,
    ``train_mars_m.py:212-219``) takes their AdamW (:func:`mars.reference.mars_m_adamw_step`) with the group's
    ``lr`` and ``weight_decay`` and ``adamw_betas``/``adamw_eps``, as their code does (``mars_m.py:222-250``).
    A group's own ``lr``/``weight_decay`` set those of its tensors, whichever rule they take; a group may set any
    hyperparameter of its own, and is refused (ValueError) one that holds for the whole optimizer: ``is_approx``,
    ``process_group``, ``foreach``, ``ns_cuda_graph``, ``ns_batch``. ``lr`` may be a 0-dim tensor, read as a float
    once per step.

    The remembered gradient :math:`\tilde g_{t-1}` depends on the scheme, as in :class:`mars.MARS`:

    * approximate (``is_approx=True``, MARS-M-approx): the previous step's gradient, copied by ``step()``.
    * exact (``is_approx=False``): :math:`\nabla f(x_{t-1}, \xi_t)`, the gradient of this step's batch at the
      previous parameters. Each iteration first evaluates the *next* batch at the current parameters, as the
      authors' trainer does (``train_mars_m.py:354-414``)::

          loss_fn(model, next_batch).backward()   # (clip gradients here as for the step)
          optimizer.stash_lookahead_grad()        # their update_previous_grad()
          optimizer.zero_grad()
          loss_fn(model, batch).backward()        # (clip)
          optimizer.step()                        # promotes the stash: their update_last_grad(), a no-op after it
          optimizer.zero_grad()

    The authors' ``clip_c`` flag is never read (``mars_m.py:198-200`` clip unconditionally), so their runs all
    clipped: ``clip_c=True`` is that default, ``clip_c=False`` the unclipped rule the flag describes. State
    (float32 for bfloat16/float16/float32 parameters, float64 for float64 ones): ``momentum_buffer`` and
    ``last_grad`` per matrix (plus ``previous_grad``, the stash, in the exact scheme); ``step``, ``exp_avg``,
    ``exp_avg_sq`` per AdamW tensor.

    Args:
        params: parameters or parameter groups; a group may set ``matrix_rule=False`` to send its 2-D tensors to
            AdamW, and its own ``lr``/``weight_decay``.
        lr: learning rate (the authors' ``lr``): the matrices step by lr * 0.2 sqrt(max(A, B)), AdamW by lr.
        momentum: beta of the momentum and of the correction (the authors' trainer passes its ``beta1``).
        weight_decay: decoupled weight decay lr * weight_decay of every tensor (the authors' ``wd``).
        gamma: strength of the variance-reduction correction (0: Moonlight without Nesterov, on clipped g_t).
        clip_c: scale c_t to unit Frobenius norm when it is longer.
        is_approx: approximate (True) or exact (False) scheme, see above.
        ns_steps: Newton-Schulz iterations.
        adamw_betas, adamw_eps: AdamW's betas and eps (the authors' trainer passes its ``betas_1d``).
        matrix_rule: default of the group option above.
        ns_dtype: Newton-Schulz dtype: the authors' bfloat16, float32 (~10x faster on CPUs without bfloat16
            matrix units) or float64.
        process_group: under DDP (every rank holding the same gradients), the ranks share the Newton-Schulz work
            out as :class:`mars.Muon` does. Held weakly (:class:`mars.optimizer.WeakProcessGroup`).
        foreach: step the elementwise part (everything but Newton-Schulz) of each group's tensors together with
            ``torch._foreach_*`` ops (:mod:`mars.mars_m_foreach`: on CUDA a few kernel launches per operation
            instead of one per tensor) or, with False, tensor by tensor through :mod:`mars.reference`. The two
            give the same results, on the CPU bit for bit. None (default) takes foreach on every device: on the
            CPU too it measured as fast or faster, as it builds c_t in place (results/bench_mars_m_cpu.md).
        ns_form: Newton-Schulz's product order (:data:`mars.newton_schulz.NS_FORMS`): the authors' ``"gram"``, or
            ``"fused_gram"``, the same products with the scalings inside them (fewer kernels, about half the
            bfloat16 rounding error).
        ns_cuda_graph: run each group's Newton-Schulz as one CUDA graph (CUDA only), as :class:`mars.Muon`'s.
        ns_batch: orthogonalise the matrices of one shape together, as one batch, as :class:`mars.Muon`'s.
    """

    # The scheme fixes what the state means, so it is the optimizer's, not a group's.
    OPTIMIZER_OPTIONS = (*_ShapeScaledOrthogonal.OPTIMIZER_OPTIONS, "is_approx")
    CORRECTED_RULES = ("matrices",)

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95, weight_decay: float = 0.1,
                 gamma: float = 0.025, clip_c: bool = True, is_approx: bool = True, ns_steps: int = 5,
                 adamw_betas: tuple[float, float] = (0.9, 0.95), adamw_eps: float = 1e-8, matrix_rule: bool = True,
                 ns_dtype: torch.dtype = torch.bfloat16, process_group: dist.ProcessGroup | None = None,
                 foreach: bool | None = None, ns_form: str = "gram", ns_cuda_graph: bool = False,
                 ns_batch: bool = False):
        super().__init__(params, **self._base_arguments(locals()))

    def _directions(self, params, states, group, rules) -> list[Tensor]:
        return rules.mars_m_momenta([param.grad for param in params], state_buffers(params, states, "last_grad"),
                                    state_buffers(params, states, "momentum_buffer"), momentum=group["momentum"],
                                    gamma=group["gamma"], clip_c=group["clip_c"], remember_grad=self.is_approx)


class MarsMEfficient(_ShapeScaledOrthogonal):
    r"""The memory-efficient MARS-M (``MARS_M/optimizers/mars_m_efficient.py``): approximate, unclipped MARS-M with
    one state buffer per matrix instead of two.

    .. math::
        b_t &= \beta b_{t-1} + \tfrac{(1-\gamma)(1-\beta)}{\beta} g_t, \qquad d_t = \gamma g_t + \beta b_t \\
        x_{t+1} &= x_t (1 - \eta_t \lambda) - \eta_t \cdot 0.2 \sqrt{\max(A, B)}\ \mathrm{NS}_k(d_t)

    :math:`d_t` equals the momentum of :class:`MarsM` with ``is_approx=True, clip_c=False``
    (:func:`mars.reference.mars_m_efficient_direction`), so the two step alike up to rounding. Arguments and
    the AdamW part as :class:`MarsM`'s; ``momentum`` must be > 0.
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95, weight_decay: float = 0.1,
                 gamma: float = 0.025, ns_steps: int = 5, adamw_betas: tuple[float, float] = (0.9, 0.95),
                 adamw_eps: float = 1e-8, matrix_rule: bool = True, ns_dtype: torch.dtype = torch.bfloat16,
                 process_group: dist.ProcessGroup | None = None, foreach: bool | None = None, ns_form: str = "gram",
                 ns_cuda_graph: bool = False, ns_batch: bool = False):
        super().__init__(params, **self._base_arguments(locals()))

    def _check_group(self, group: dict[str, Any]) -> None:
        super()._check_group(group)
        if group["momentum"] == 0.0:
            raise ValueError("momentum must be in (0, 1) for MarsMEfficient, whose buffer is scaled by 1 / momentum; "
                             "got 0.0")

    def _directions(self, params, states, group, rules) -> list[Tensor]:
        return rules.mars_m_efficient_directions([param.grad for param in params],
                                                 state_buffers(params, states, "momentum_buffer"),
                                                 momentum=group["momentum"], gamma=group["gamma"])


class Moonlight(_ShapeScaledOrthogonal):
    r"""Moonlight: Muon with its update scaled to AdamW's RMS (arXiv 2502.16982), the MARS-M paper's baseline as its
    authors ran it (``MARS_M/optimizers/moonlight.py``).

    .. math::
        b_t &= \beta b_{t-1} + g_t, \qquad d_t = g_t + \beta b_t \ \text{(nesterov)} \quad\text{or}\quad d_t = b_t \\
        x_{t+1} &= x_t (1 - \eta_t \lambda) - \eta_t \cdot 0.2 \sqrt{\max(A, B)}\ \mathrm{NS}_k(d_t)

    (:func:`mars.reference.moonlight_step`). Arguments, routing, Newton-Schulz and the AdamW part as
    :class:`MarsM`'s; ``nesterov`` as the authors' (default True; their trainer leaves it so). State:
    ``momentum_buffer`` per matrix; ``step``, ``exp_avg``, ``exp_avg_sq`` per AdamW tensor.
    """

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.95, weight_decay: float = 0.1,
                 nesterov: bool = True, ns_steps: int = 5, adamw_betas: tuple[float, float] = (0.9, 0.95),
                 adamw_eps: float = 1e-8, matrix_rule: bool = True, ns_dtype: torch.dtype = torch.bfloat16,
                 process_group: dist.ProcessGroup | None = None, foreach: bool | None = None, ns_form: str = "gram",
                 ns_cuda_graph: bool = False, ns_batch: bool = False):
        super().__init__(params, **self._base_arguments(locals()))

    def _directions(self, params, states, group, rules) -> list[Tensor]:
        return rules.moonlight_directions([param.grad for param in params],
                                          state_buffers(params, states, "momentum_buffer"),
                                          momentum=group["momentum"], nesterov=group["nesterov"])
