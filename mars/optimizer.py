"""``torch.optim`` front end for MARS: gathers each parameter group's tensors and hands them to a backend.

The update rules live in :mod:`mars.reference`; the backends (:mod:`mars.torch_backend`,
:mod:`mars.triton_backend`) compute the same rules over whole lists of tensors and are tested against it.

What every optimizer of the package shares lives here too: :class:`DispatchingOptimizer`, the skeleton of a step
(sort each group's tensors by rule, hand each list to its rule), and :class:`LookaheadGradient`, the exact scheme's
look-ahead gradient (MARS and MARS-M).
"""
import functools
import importlib
import importlib.util
import itertools
import operator
import os
import weakref
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from itertools import chain
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from mars import reference, shampoo_foreach, torch_backend
from mars.cuda_graph import CapturedLists, CudaGraphedNewtonSchulz
from mars.newton_schulz import check_ns_form, orthogonalise
from mars.step_count import advance_steps
from mars.traits import DEFAULTS as TRAIT_DEFAULTS

BACKENDS = ("auto", "reference", "torch", "triton")


def _find_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a finder that refuses it, a broken install
        return False


_TRITON_INSTALLED = _find_triton()  # looked up once, at import: a traced step cannot run the import system


def triton_is_installed() -> bool:
    """Whether the ``triton`` package can be imported (it is not needed for the CPU backends)."""
    return _TRITON_INSTALLED


def triton_interpreter_enabled() -> bool:
    """Whether Triton kernels may run on CPU tensors through its interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def available_backends(device: torch.device | str = "cpu") -> tuple[str, ...]:
    """The explicit backends that can run on ``device`` here (``"auto"`` always can)."""
    device = torch.device(device)
    names = ["reference", "torch"]
    if triton_is_installed() and (device.type == "cuda" or triton_interpreter_enabled()):
        names.append("triton")
    return tuple(names)


def check_betas(name: str, betas: Any) -> None:
    """Raise a ValueError naming ``name`` unless ``betas`` is a pair with 0 <= beta < 1."""
    if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
        raise ValueError(f"{name} must be a pair (beta1, beta2) with 0 <= beta < 1, got {betas!r}")


def check_flags(**flags: Any) -> None:
    """Raise a ValueError naming the first argument that is not a bool."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")


def check_non_negative(**values: float) -> None:
    """Raise a ValueError naming the first argument that is negative (or NaN)."""
    for name, value in values.items():
        if not value >= 0.0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")


def check_real_params(params: Iterable[Tensor], optimizer_name: str) -> None:
    """Raise a ValueError for complex parameters, which the update rules do not define."""
    if any(torch.is_complex(param) for param in params):
        raise ValueError(
            f"{optimizer_name} does not support complex parameters; optimize torch.view_as_real(param) instead"
        )


def state_zeros_like(param: Tensor) -> Tensor:
    """A contiguous zero state buffer shaped like ``param``: float32 for bfloat16/float16/float32 parameters,
    float64 for float64 ones (:func:`mars.reference.working_dtype`)."""
    return torch.zeros_like(param, dtype=reference.working_dtype(param), memory_format=torch.contiguous_format)


def as_float(value: float | Tensor) -> float:
    """A hyperparameter as a Python float: a tensor lr (``lr=torch.tensor(1e-3)``, as torch.optim takes) is read
    once per step, since the backends do their step-size arithmetic on the host. A CPU tensor is read without any
    device sync; a CUDA one costs one sync per group and step."""
    return value.item() if torch.is_tensor(value) else value


def step_lr(value: float | Tensor) -> float | Tensor:
    """A learning rate as a step computes with it: a float (:func:`as_float`), but while traced (``torch.compile``)
    a tensor lr stays a tensor, an input of the graph whose new values (a torch scheduler fills it in place) need no
    new graph, where a float read from it would be a constant of each: torch's recipe for a compiled step under a
    scheduler, ``lr=torch.tensor(...)``. The update arithmetic takes either (:func:`mars.reference.add_scaled_`)."""
    if torch.is_tensor(value) and torch.compiler.is_compiling():
        return value
    return as_float(value)


def check_ns_dtype(ns_dtype: torch.dtype) -> None:
    """Newton-Schulz runs in bfloat16 (the authors'), float32 or float64."""
    if ns_dtype not in (torch.bfloat16, torch.float32, torch.float64):
        raise ValueError(f"ns_dtype must be torch.bfloat16, torch.float32 or torch.float64, got {ns_dtype!r}")


def check_newton_schulz_group(group: dict[str, Any]) -> None:
    """Check what Muon, MARS-M and Moonlight groups share: the momentum and Newton-Schulz of the matrices, the
    AdamW betas of the other tensors."""
    if not 0.0 <= group["momentum"] < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {group['momentum']!r}")
    ns_steps = group["ns_steps"]
    if not (isinstance(ns_steps, int) and not isinstance(ns_steps, bool) and ns_steps >= 1):
        raise ValueError(f"ns_steps must be an int >= 1, got {ns_steps!r}")
    check_betas("adamw_betas", group["adamw_betas"])
    check_ns_dtype(group["ns_dtype"])


def refuse_optimizer_options(param_group: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """Raise a ValueError naming the first key of ``param_group`` that sets an option of the whole optimizer
    (``OPTIMIZER_OPTIONS``) to another value than the optimizer's: silently ignored, it would step with another
    value. The optimizer's own value is taken out of the group (``ZeroRedundancyOptimizer`` passes its constructor
    arguments in every group)."""
    for key in type(optimizer).OPTIMIZER_OPTIONS:
        if key not in param_group:
            continue
        value, own = param_group.pop(key), getattr(optimizer, key)
        if value is not own and value != own:
            raise ValueError(f"{key} is an option of the whole {type(optimizer).__name__}, not of a param group "
                             f"(got {value!r}, the optimizer's is {own!r}): pass it to the constructor, or use one "
                             "optimizer per value")


def check_learning_rates(group: dict[str, Any], names: tuple[str, ...]) -> None:
    """Raise a ValueError naming the first learning rate of ``group`` among ``names`` that is a tensor of more than
    one element (as torch.optim: a float or a 1-element tensor) or negative."""
    for name in names:
        value = group[name]
        if torch.is_tensor(value) and value.numel() != 1:
            raise ValueError(f"Tensor {name} must be 1-element (a float or a 0-dim tensor), got shape "
                             f"{tuple(value.shape)}")
        check_non_negative(**{name: value})


def ratio_key(name: str) -> str:
    """The key under which a param group keeps a learning rate that follows its lr (``lr_1d`` -> ``lr_1d_ratio``)."""
    return f"{name}_ratio"


def ratio_to_lr(name: str, rate: float | Tensor, lr: float | Tensor) -> float:
    """``rate / lr``, the ratio a group keeps of the learning rate ``name`` to its lr. A group created at lr = 0 has no
    ratio to keep unless ``rate`` is 0 too: refused, naming both."""
    rate, lr = as_float(rate), as_float(lr)
    if lr > 0.0:
        return rate / lr
    if rate == 0.0:
        return 0.0
    raise ValueError(
        f"{name}={rate!r} with lr=0: {name} follows the group's lr as the ratio {name} / lr, fixed when the group is "
        f"created, and lr=0 gives no ratio. Create the group at its peak lr and let the schedule start it at 0 (as "
        f"torch's LambdaLR or LinearLR warmups do), or set {name}=0"
    )


def ratios_from_saved_learning_rates(state_dict: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """``state_dict`` with each saved group's learning rate among ``names`` (MARS's ``lr_1d``, which versions of
    2026-11-27 saved as a rate) turned into the ratio to lr it steps with; a saved ratio is kept as it is."""
    def upgraded(group: dict[str, Any]) -> dict[str, Any]:
        group = dict(group)
        for name in names:
            rate = group.pop(name, None)
            if ratio_key(name) not in group and rate is not None:
                group[ratio_key(name)] = ratio_to_lr(name, rate, group["lr"])
        return group

    return {**state_dict, "param_groups": [upgraded(group) for group in state_dict["param_groups"]]}


def keep_following_rates_as_ratios(group: dict[str, Any], names: tuple[str, ...], own_ratios: set[str]) -> None:
    """Replace each learning rate of ``group`` among ``names`` by its ratio to the group's lr, unless the group came
    with that ratio (``own_ratios``: a group copied from another optimizer's, as ZeroRedundancyOptimizer's shards)."""
    for name in names:
        rate = group.pop(name)
        if name not in own_ratios:
            group[ratio_key(name)] = ratio_to_lr(name, rate, group["lr"])
        ratio = group[ratio_key(name)]
        if not (isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0.0 <= ratio < float("inf")):
            raise ValueError(f"{ratio_key(name)} must be a finite float >= 0 ({name} / lr), got {ratio!r}")


def following_rate(group: dict[str, Any], name: str) -> float | Tensor:
    """The learning rate ``name`` a group steps with now: its ratio times the group's current lr (:func:`step_lr`)."""
    return step_lr(group["lr"]) * group[ratio_key(name)]


def restore_state_dtype(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """Undo ``Optimizer.load_state_dict``'s cast of floating state to the parameter dtype.

    torch assumes state has the parameter's dtype; these optimizers keep float32 state for bfloat16/float16
    parameters (:func:`state_zeros_like`), and a cast to bfloat16 and back would silently change the next step.
    """
    saved_ids = chain.from_iterable(group["params"] for group in state_dict["param_groups"])
    params = chain.from_iterable(group["params"] for group in optimizer.param_groups)
    for saved_id, param in zip(saved_ids, params):
        state_dtype = reference.working_dtype(param)
        if param.dtype == state_dtype:
            continue
        for key, value in state_dict["state"].get(saved_id, {}).items():
            if torch.is_tensor(value) and value.is_floating_point():
                optimizer.state[param][key] = value.to(device=param.device, dtype=state_dtype, copy=True)


class WeakProcessGroup:
    """An optimizer's ``process_group`` attribute, held by weak reference: torch.distributed owns the group.

    ``destroy_process_group()`` only drops torch's own references; a Gloo group stops its worker threads when
    its last reference goes. An optimizer that kept it alive past the shutdown would leave those threads
    running into interpreter finalization, where one releasing a collective's tensors aborts the process
    (SIGABRT, "terminate called without an active exception"). Reading the attribute once the group is gone
    raises rather than quietly stepping alone. A pickle leaves the group out (``Optimizer.__getstate__``): an
    unpickled optimizer steps alone.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_ref"

    def __get__(self, optimizer: torch.optim.Optimizer | None, owner: type | None = None):
        if optimizer is None:
            return self
        reference = optimizer.__dict__.get(self.slot)
        if reference is None:
            return None
        group = reference()
        if group is None:
            raise RuntimeError(
                f"the process group of this {type(optimizer).__name__} was destroyed "
                "(torch.distributed.destroy_process_group); set its process_group to a live group, or to None "
                "to step in one process"
            )
        return group

    def __set__(self, optimizer: torch.optim.Optimizer, group: dist.ProcessGroup | None) -> None:
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise TypeError(f"process_group must be a torch.distributed.ProcessGroup or None, got {group!r}")
        optimizer.__dict__[self.slot] = None if group is None else weakref.ref(group)


def refuse_missing_options(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """Raise a ValueError naming the first hyperparameter of ``optimizer`` that a saved param group lacks.

    ``Optimizer.load_state_dict`` puts the saved groups in place of the optimizer's, so a hyperparameter missing
    from them would be missing at the next step: the state dict is another optimizer's, or older than the option.
    """
    following = type(optimizer).FOLLOWING_LRS
    for index, saved_group in enumerate(state_dict["param_groups"]):
        for name, value in optimizer.defaults.items():
            key = ratio_key(name) if name in following else name
            if key not in saved_group:
                raise ValueError(
                    f"param group {index} of the state dict has no {key!r}: it was saved by another optimizer than "
                    f"{type(optimizer).__name__}, or by a version without that option. Add {key!r} to every saved "
                    f"param group with the value the run used ({value!r} is this optimizer's), or start the "
                    "optimizer afresh"
                )


def raise_sparse_gradient(optimizer: torch.optim.Optimizer) -> None:
    raise RuntimeError(f"{type(optimizer).__name__} does not support sparse gradients; use dense gradients "
                       "(e.g. torch.nn.Embedding(sparse=False))")


_GRAD = operator.attrgetter("grad")
_IS_SPARSE = operator.attrgetter("is_sparse")
_LAYOUT = operator.attrgetter("device", "dtype", "ndim")


class GroupPlan:
    """What a step needs of a param group that stays the same from step to step: its tensors with a gradient,
    listed by rule, and what the lists were built from: ``key`` (the ids of the group's tensors, which of them have
    a gradient, their devices, dtypes and dimensions, the hyperparameters that choose a rule, the size of the
    state) and ``state``, the
    optimizer's state object. The plan holds the tensors and the state, so that no other object takes their ids
    while it is kept."""

    __slots__ = ("key", "state", "params", "by_rule")

    def __init__(self, key: tuple, state: dict, params: tuple[Tensor, ...], by_rule: dict[str, list[Tensor]]):
        self.key, self.state, self.params, self.by_rule = key, state, params, by_rule


class DispatchingOptimizer(torch.optim.Optimizer):
    """The skeleton of this package's optimizers: ``step()`` sorts each group's tensors that have a gradient by the
    update rule each takes (:meth:`_rule`, one of ``RULES``) and hands the group's lists, by rule, to
    :meth:`_step_group`; a group is checked by :meth:`_check_group` when it is added.

    The Python work of a step is done once and kept while nothing it depends on changes: each group's lists by rule
    (:class:`GroupPlan`), and what the rules derive from those lists (each list's state dicts, MARS's lists by
    backend: :meth:`_planned`). They are rebuilt when a tensor of a group gains or loses its gradient, a group's
    tensors or the hyperparameters that choose a rule (``RULE_KEYS``) or a tensor's device, dtype or dimensions
    change (``param.data = ...``), the state is replaced or changes size (``load_state_dict``, ``state.clear()``, a first step of a tensor), or a group is
    added. Not seen: a state entry replaced by hand for the same tensor (``optimizer.state[p] = {...}``), which
    the kept lists would not read; ``load_state_dict`` is the way to set state. By default the 2-D tensors
    take the optimizer's matrix rule (:meth:`_matrix_step`) and the others its AdamW (:meth:`_adamw_step`), as in
    Muon, MARS-M and Moonlight; MARS sorts its own way.

    Every learning rate (``LEARNING_RATES``: ``lr``, and MARS's ``lr_1d``, Muon's ``adamw_lr``) may be a float or a
    1-element tensor, read as a float once per step. A group falls back to the constructor's value of each one it
    does not set, as in torch.optim: a group's own ``lr`` leaves its ``lr_1d`` alone. The second learning rates
    (``FOLLOWING_LRS``) follow the group's lr as the authors' ``lr_1d_factor`` does: a group keeps each as its ratio
    to its own lr when it is created (``lr_1d_ratio = lr_1d / lr``, :func:`ratio_key`) and steps with the ratio
    times its current lr, so that whatever sets ``lr`` (a torch scheduler, the trainer) moves every rate of the
    group in proportion, and lr = 0 freezes the group. The ratio is saved with the group. A rate written into a
    group between steps (``group["lr_1d"] = 1e-3``) takes effect at the next step, as the ratio to the group's lr
    then (:meth:`_take_rates_written_since_the_last_step`).

    The options of the whole optimizer (``OPTIMIZER_OPTIONS``, passed to ``__init__`` by name) are attributes, kept
    out of the param groups that ``state_dict()`` saves, refused in a group, and kept through a copy or pickle, but
    the process group: torch.distributed owns it, and an unpickled optimizer steps alone. The optimizers that run
    Newton-Schulz add their own (``ns_cuda_graph``, ``ns_batch``: :class:`mars.cuda_graph.CudaGraphedNewtonSchulz`);
    this class knows nothing of Newton-Schulz.

    State is float32 for bfloat16/float16/float32 parameters and float64 for float64 ones
    (:func:`state_zeros_like`), through ``load_state_dict`` and pickling too. A state dict whose param groups lack
    one of the optimizer's hyperparameters is refused (:func:`refuse_missing_options`).
    """

    process_group = WeakProcessGroup()
    OPTIMIZER_OPTIONS: tuple[str, ...] = ()
    RULES: tuple[str, ...] = ("matrices", "others")
    LEARNING_RATES: tuple[str, ...] = ("lr",)
    # The learning rates of LEARNING_RATES that a group keeps as a ratio to its lr (ratio_key).
    FOLLOWING_LRS: tuple[str, ...] = ()
    # The traits the harness reads of any optimizer class (mars/traits.py says each): set one in a subclass.
    STATE_ONLY_STEPS: int = TRAIT_DEFAULTS["STATE_ONLY_STEPS"]
    UPDATES_LINEAR_IN_LR: bool = TRAIT_DEFAULTS["UPDATES_LINEAR_IN_LR"]
    GROUP_STATE_KEYS: tuple[str, ...] = TRAIT_DEFAULTS["GROUP_STATE_KEYS"]
    # The group hyperparameters that :meth:`_rule` reads: a change sorts the group's tensors again.
    RULE_KEYS: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict[str, Any], **options: Any):
        if options.get("foreach") is not None:
            check_flags(foreach=options["foreach"])
        # Before params is read, as torch's Adam: a bad hyperparameter is named whatever params is.
        check_learning_rates(defaults, self.LEARNING_RATES)
        # Set first: add_param_group compares a group's options with them.
        for key, value in options.items():
            setattr(self, key, value)
        self._check_group(dict(defaults))
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group after checking its hyperparameters (defaults filled in) and its parameters."""
        refuse_optimizer_options(param_group, self)
        own_ratios = {name for name in self.FOLLOWING_LRS if ratio_key(name) in param_group}
        super().add_param_group(param_group)
        self._forget_plans()
        group = self.param_groups[-1]
        check_real_params(group["params"], type(self).__name__)
        check_learning_rates(group, self.LEARNING_RATES)
        self.__dict__.setdefault("_rates_taken", []).append({name: group[name] for name in self.FOLLOWING_LRS})
        keep_following_rates_as_ratios(group, self.FOLLOWING_LRS, own_ratios)
        self._check_group(group)

    def _check_group(self, group: dict[str, Any]) -> None:
        """Raise a ValueError naming the first hyperparameter of ``group`` but its learning rates that is out of
        range."""
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as ``torch.optim.Optimizer`` does, keeping float32 state for low-precision parameters; refuse a
        state dict whose groups lack a hyperparameter."""
        state_dict = ratios_from_saved_learning_rates(state_dict, self.FOLLOWING_LRS)
        refuse_missing_options(self, state_dict)
        super().load_state_dict(state_dict)
        self._forget_plans()  # new state dicts and param groups
        restore_state_dtype(self, state_dict)

    def __getstate__(self) -> dict[str, Any]:
        # Optimizer.__getstate__ keeps only defaults, state and groups.
        options = {key: getattr(self, key) for key in self.OPTIMIZER_OPTIONS if key != "process_group"}
        return {**super().__getstate__(), **options, "_rates_taken": self.__dict__.get("_rates_taken", [])}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        # torch's __setstate__ adds its own ``differentiable`` to the defaults, which these optimizers do not
        # take: left there, it would join every group and a loaded state dict would come back with a new key.
        self.defaults.pop("differentiable", None)

    @torch.no_grad()
    def step(self, closure=None):
        """One step on every parameter that has a gradient; returns the closure's loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._take_rates_written_since_the_last_step()
        # Every group is planned before any update, so that an error (a sparse gradient) leaves every parameter and
        # its state untouched.
        plans = [self._plan(index, group) for index, group in enumerate(self.param_groups)]
        for group, plan in zip(self.param_groups, plans):
            step_group = self._step_group_eagerly if self._steps_eagerly(group) else self._step_group
            step_group(group, **plan.by_rule)
        return loss

    def _steps_eagerly(self, group: dict[str, Any]) -> bool:
        """Whether the group's update runs eagerly inside a compiled step (a graph break around it): where code
        that cannot be traced steps its tensors (MARS's Triton launches). None here."""
        return False

    @torch.compiler.disable
    def _step_group_eagerly(self, group: dict[str, Any], **lists: list[Tensor]) -> None:
        # The whole group's update, gradients read here: a graph break inside it would leave the frame resumed after
        # it guarding on the step's gradients, new tensors at every step, so a new graph at every step.
        self._step_group(group, **lists)

    def _take_rates_written_since_the_last_step(self) -> None:
        """A following rate written into a group since the last step (``group["lr_1d"] = 1e-3``) takes effect now: the
        group keeps its ratio to the group's lr of this step, as a group created with it would. The rate object the
        group last took (at its creation, or a write) is no write: ZeroRedundancyOptimizer copies its own groups'
        keys, the constructor's ``lr_1d`` among them, into its shard's groups before every step, the same objects;
        a write is another object, whatever its value."""
        taken = self.__dict__.setdefault("_rates_taken", [])
        for index, group in enumerate(self.param_groups):
            if index == len(taken):
                taken.append({})
            for name in self.FOLLOWING_LRS:
                if name not in group:
                    continue
                rate = group.pop(name)
                last = taken[index].setdefault(name, rate)
                if rate is last:
                    continue
                check_learning_rates({name: rate}, (name,))
                if as_float(group["lr"]) == 0.0 and as_float(rate) != 0.0:
                    raise ValueError(
                        f"param group {index}: {name}={as_float(rate)!r} was written while the group's lr is 0, and "
                        f"{name} follows lr as the ratio {ratio_key(name)} = {name} / lr: set "
                        f"group[{ratio_key(name)!r}] instead (the rate is that ratio times lr)")
                group[ratio_key(name)] = ratio_to_lr(name, rate, group["lr"])
                taken[index][name] = rate

    def _plan(self, index: int, group: dict[str, Any]) -> GroupPlan:
        """The :class:`GroupPlan` of the group at ``index``: the kept one while its key holds, else a new one. Raises
        on a sparse gradient."""
        params = group["params"]
        if torch.compiler.is_compiling():
            # Traced, a kept plan would be read (ids, dicts of lists) as constants of the graph that dynamo's guards
            # do not check, and writes to it happen at trace time only: the lists are built afresh, kept nowhere
            # (in plain comprehensions, which dynamo traces where it cannot trace attrgetter).
            has_grad = tuple(param.grad is not None for param in params)
            if any(param.grad.is_sparse for param in itertools.compress(params, has_grad)):
                raise_sparse_gradient(self)
            return GroupPlan((), self.state, tuple(params), self._lists_by_rule(params, has_grad, group))
        grads = list(map(_GRAD, params))
        has_grad = tuple(map(operator.is_not, grads, itertools.repeat(None)))
        if any(map(_IS_SPARSE, itertools.compress(grads, has_grad))):
            raise_sparse_gradient(self)
        key = (tuple(map(id, params)), has_grad, tuple(map(_LAYOUT, params)),
               tuple(group[name] for name in self.RULE_KEYS), len(self.state))
        plans = self.__dict__.setdefault("_group_plans", {})
        plan = plans.get(index)
        if plan is None or plan.state is not self.state or plan.key != key:
            plan = plans[index] = GroupPlan(key, self.state, tuple(params), self._lists_by_rule(params, has_grad, group))
            self._forget_planned()  # what was derived from the old lists
        return plan

    def _lists_by_rule(self, params: list[Tensor], has_grad: tuple[bool, ...],
                       group: dict[str, Any]) -> dict[str, list[Tensor]]:
        """The tensors of ``params`` that have a gradient, listed by the rule each takes."""
        by_rule: dict[str, list[Tensor]] = {rule: [] for rule in self.RULES}
        for param in itertools.compress(params, has_grad):
            by_rule[self._rule(param, group)].append(param)
        return by_rule

    def _planned(self, kind: Hashable, params: list[Tensor], build: Callable[[list[Tensor]], Any]) -> Any:
        """``build(params)``, kept (under ``kind``) while ``params`` is one of the kept plans' lists, or a list kept
        with them (:meth:`_keep_as_planned`); other lists are built every call."""
        if not self._is_planned(params):
            return build(params)
        planned = self.__dict__["_planned_results"]
        if (kind, id(params)) not in planned:
            planned[kind, id(params)] = build(params)
        return planned[kind, id(params)]

    def _is_planned(self, params: list[Tensor]) -> bool:
        """Whether ``params`` is one of the kept plans' lists, or a list kept with them (never while traced: no plan
        is kept then)."""
        if torch.compiler.is_compiling():
            return False
        planned = self.__dict__.get("_planned_results")
        if planned is None:
            plans = self.__dict__.get("_group_plans", {}).values()
            planned = self.__dict__["_planned_results"] = {
                "lists": {id(each): each for plan in plans for each in plan.by_rule.values()}}
        return planned["lists"].get(id(params)) is params

    def _keep_as_planned(self, lists: Iterable[list[Tensor]]) -> None:
        """Let :meth:`_planned` keep what is derived from ``lists``: lists built from a planned list and held by
        a result kept with it, so alive (and their ids theirs) as long as it is."""
        self.__dict__["_planned_results"]["lists"].update((id(each), each) for each in lists)

    def _forget_planned(self) -> None:
        self.__dict__.pop("_planned_results", None)

    def _forget_plans(self) -> None:
        """Drop every plan and what was derived from them: the groups or the state were replaced."""
        self.__dict__.pop("_group_plans", None)
        self._forget_planned()

    def _rule(self, param: Tensor, group: dict[str, Any]) -> str:
        """The rule of ``RULES`` that steps ``param`` in ``group``."""
        return "matrices" if param.dim() == 2 else "others"

    def _step_group(self, group: dict[str, Any], *, matrices: list[Tensor], others: list[Tensor]) -> None:
        """Step a group's tensors, listed by rule."""
        if others:
            self._adamw_step(others, group)
        if matrices:
            self._matrix_step(matrices, group)

    def _matrix_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """Step a group's 2-D tensors."""
        raise NotImplementedError

    def _adamw_step(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """Step a group's other tensors."""
        raise NotImplementedError

    def _states(self, params: list[Tensor]) -> list[dict[str, Any]]:
        """Each parameter's state dict, kept with the plan for a planned list (:meth:`_planned`): a lookup hashes
        the tensor in Python (``Tensor.__hash__``), too slow to repeat for every parameter every step."""
        return self._planned("states", params, lambda each: [self.state[param] for param in each])


class OneRuleOptimizer(DispatchingOptimizer):
    """A :class:`DispatchingOptimizer` with one update rule for every tensor, whatever its shape (Lion, ADOPT):
    a subclass gives its constructor (hyperparameters as ``defaults``), :meth:`_check_group` and :meth:`_update`,
    the rule over a group's tensors that have a gradient."""

    RULES = ("every_tensor",)

    def _rule(self, param: Tensor, group: dict[str, Any]) -> str:
        return "every_tensor"

    def _step_group(self, group: dict[str, Any], *, every_tensor: list[Tensor]) -> None:
        if every_tensor:
            self._update(every_tensor, group)

    def _update(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """Step ``params``, the group's tensors that have a gradient (their states: :meth:`_states`)."""
        raise NotImplementedError


class LookaheadGradient:
    """The exact scheme (``is_approx=False``) of MARS and MARS-M, mixed into a :class:`DispatchingOptimizer`.

    A step corrects its gradient by the gradient of the same batch at the previous parameters. The training loop
    computes it one iteration ahead, the next batch at the current parameters, and hands it over with
    ``stash_lookahead_grad()`` before every ``step()`` (the optimizer's docstring shows the loop); ``step()`` then
    makes the stash (``previous_grad``) the remembered gradient (``last_grad``) of the tensors of
    ``CORRECTED_RULES``. The approximate scheme remembers the step's own gradient instead: there the stash is a
    no-op and the loop is the usual one.

    Between steps ``previous_grad`` is ``last_grad``, one buffer under both names. A stash fills a buffer of its
    own (the one that the last promotion freed) and names it ``previous_grad``, so that a stash no step takes (a
    step the trainer skips for a non-finite gradient) can be dropped, the state left as it was before it:
    :meth:`discard_lookahead_grad`. Two buffers a tensor, as a stash copied into ``previous_grad`` would take.
    This bookkeeping runs eagerly within a compiled step too (``torch.compiler.disable``): a traced step's writes
    to the optimizer's own attributes are not replayed, and a promoted stash would stay listed as pending.
    """

    CORRECTED_RULES: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict[str, Any], *, is_approx: bool, **options: Any):
        check_flags(is_approx=is_approx)
        self._lookahead_stashed = False
        # Each tensor stashed since the last step: (the tensor, its state, the state's previous_grad before the stash).
        self._stashed: list[tuple[Tensor, dict, Tensor | None]] = []
        super().__init__(params, defaults, is_approx=is_approx, **options)

    @property
    def needs_lookahead_grad(self) -> bool:
        """True in the exact scheme: call ``stash_lookahead_grad()`` before every ``step()``."""
        return not self.is_approx

    @torch.compiler.disable
    @torch.no_grad()
    def stash_lookahead_grad(self) -> None:
        """Exact scheme: remember ``p.grad`` (the next batch at the current parameters) of every tensor whose rule
        corrects its gradient, for the next step. A no-op in the approximate scheme, as the authors'
        ``update_previous_grad``. A second stash before a step replaces the first."""
        if self.is_approx:
            return
        self.discard_lookahead_grad()
        params = [param for group in self.param_groups for param in group["params"]
                  if param.grad is not None and self._rule(param, group) in self.CORRECTED_RULES]
        states = self._states(params)
        # Held with their states (_freed_buffers), whose ids no other object can take meanwhile.
        freed = {id(state): buffer for state, buffer in self.__dict__.pop("_freed_buffers", [])}
        stashes = [freed.get(id(state)) for state in states]
        stashes = [state_zeros_like(param) if stash is None else stash for param, stash in zip(params, stashes)]
        self._stashed = [(param, state, state.get("previous_grad")) for param, state in zip(params, states)]
        for state, stash in zip(states, stashes):
            state["previous_grad"] = stash
        if params:
            torch._foreach_copy_(stashes, [param.grad for param in params])
        self._lookahead_stashed = True

    update_previous_grad = stash_lookahead_grad  # the authors' name

    @torch.compiler.disable
    @torch.no_grad()
    def discard_lookahead_grad(self) -> None:
        """Drop the stash that no step took (the trainer skips a step whose loss or gradients are not finite): the
        state is again what it was before :meth:`stash_lookahead_grad`, and the next step needs a stash of its own.
        Without a stash, nothing changes."""
        freed = self.__dict__.setdefault("_freed_buffers", [])
        for param, state, before in self._stashed:
            stash = state.pop("previous_grad")
            if before is not None:
                state["previous_grad"] = before
            elif not state:  # the stash gave the tensor its first state
                del self.state[param]
                continue
            freed.append((state, stash))
        self._stashed = []
        self._lookahead_stashed = False

    @torch.compiler.disable
    @torch.no_grad()
    def update_last_grad(self) -> None:
        """Exact scheme: make the stash the remembered gradient. ``step()`` already does it; again, it does nothing.

        The stash is named ``last_grad`` rather than copied there: the same values, one read and one write of every
        tensor fewer. The buffer that ``last_grad`` named is kept for the next stash; only tensors stashed since the
        last promotion take part.
        """
        freed = self.__dict__.setdefault("_freed_buffers", [])
        for _, state, _ in self._stashed:
            remembered = state.get("last_grad")
            state["last_grad"] = state["previous_grad"]
            if remembered is not None:
                freed.append((state, remembered))
        self._stashed = []

    def step(self, closure=None):
        """The optimizer's step; in the exact scheme after a stash, which it then promotes."""
        if self.needs_lookahead_grad and not self._lookahead_stashed:
            raise RuntimeError(
                f"{type(self).__name__} with is_approx=False needs stash_lookahead_grad() (the gradient of the next "
                "batch at the current parameters) before every step(); see the class docstring for the loop"
            )
        loss = super().step(closure)
        if self.needs_lookahead_grad:
            self.update_last_grad()
            self._lookahead_stashed = False
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does; a stash taken before belongs to the state that the loaded one replaces. A loaded
        ``previous_grad`` equal to ``last_grad`` (what a step leaves, loaded as two tensors where the load moved or
        cast them) becomes that one buffer again."""
        super().load_state_dict(state_dict)
        self._lookahead_stashed = False
        self._stashed = []
        self.__dict__.pop("_freed_buffers", None)
        for state in self.state.values():
            remembered, stash = state.get("last_grad"), state.get("previous_grad")
            if stash is not None and remembered is not None and stash is not remembered:
                if torch.equal(stash, remembered):
                    state["previous_grad"] = remembered

    def __getstate__(self) -> dict[str, Any]:
        # A stashed look-ahead gradient survives a copy or pickle (pickle keeps the states it names shared); the
        # freed buffers are left behind, a copy's first stash makes its own.
        return {**super().__getstate__(), "_lookahead_stashed": self._lookahead_stashed, "_stashed": self._stashed}


def _reference_mars_group_step(
    params, grads, last_grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, *, steps, remember_grad, **hyper
) -> None:
    """The backend interface over :func:`mars.reference.mars_step`, one tensor at a time."""
    for i, (param, grad, last_grad, exp_avg) in enumerate(zip(params, grads, last_grads, exp_avgs)):
        reference.mars_step(
            param, grad, last_grad, exp_avg,
            None if exp_avg_sqs is None else exp_avg_sqs[i],
            None if max_exp_avg_sqs is None else max_exp_avg_sqs[i],
            step=steps[i], **hyper,
        )
        if remember_grad:
            last_grad.copy_(grad)


def _reference_adamw_group_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, *, steps, **hyper) -> None:
    """The backend interface over :func:`mars.reference.adamw_step`, one tensor at a time."""
    for i, (param, grad, exp_avg, exp_avg_sq) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs)):
        reference.adamw_step(
            param, grad, exp_avg, exp_avg_sq,
            None if max_exp_avg_sqs is None else max_exp_avg_sqs[i],
            step=steps[i], **hyper,
        )


# Also the path for mars-shampoo's 2-D tensors with backend="reference" (one tensor at a time, as the official code).
REFERENCE_BACKEND = SimpleNamespace(
    mars_group_step=_reference_mars_group_step, adamw_group_step=_reference_adamw_group_step
)


class MARS(LookaheadGradient, CudaGraphedNewtonSchulz, DispatchingOptimizer):
    r"""MARS: variance-reduced preconditioned optimization (Yuan et al., 2024, arXiv 2411.10438).

    For a tensor taking the MARS rule (2-D tensors, or all with ``optimize_1d``), with gradient
    :math:`g_t = \nabla f(x_t, \xi_t)` and remembered gradient :math:`\tilde g_{t-1}`:

    .. math::
        c_t &= g_t + \gamma \tfrac{\beta_1}{1-\beta_1} (g_t - \tilde g_{t-1}),
               \qquad c_t \leftarrow c_t / \|c_t\|_2 \text{ if } \|c_t\|_2 > 1 \\
        m_t &= \beta_1 m_{t-1} + (1-\beta_1) c_t \\
        \text{mars-adamw:}\quad v_t &= \beta_2 v_{t-1} + (1-\beta_2) c_t^2,\quad
               u_t = \frac{m_t / (1-\beta_1^t)}{\sqrt{v_t / (1-\beta_2^t)} + \epsilon}
               \quad (\text{amsgrad: } v_t \leftarrow \max(v_t, v_{t-1}^{\max})) \\
        \text{mars-lion:}\quad u_t &= \operatorname{sign}(m_t) \\
        \text{mars-shampoo:}\quad u_t &= \mathrm{NS}_5\!\big(m_t / (1-\beta_1)\big)\sqrt{\max(1, rows/cols)} \\
        x_{t+1} &= x_t - \eta_t (u_t + \lambda x_t)

    Other tensors (biases, norms) take AdamW on :math:`g_t` with ``betas_1d``, weight decay
    ``weight_decay_1d`` (the group's ``weight_decay`` does not apply to them) and learning rate ``lr_1d``, which
    follows the group's lr: the group keeps ``lr_1d_ratio = lr_1d / lr`` from its creation and steps its 1-D
    tensors at ``lr_1d_ratio`` times its current lr, as the authors' ``lr_1d_factor`` (``MARS/optimizers/mars.py``),
    so any torch scheduler on ``lr`` schedules both.

    The remembered gradient :math:`\tilde g_{t-1}` depends on the scheme:

    * approximate (``is_approx=True``, the paper's MARS-approx): :math:`\tilde g_{t-1} = g_{t-1}`, the
      previous step's gradient, copied by ``step()``. The training loop is the usual one.
    * exact (``is_approx=False``): :math:`\tilde g_{t-1} = \nabla f(x_{t-1}, \xi_t)`, the gradient of the
      *current* batch at the *previous* parameters (zeros at the first step). Each iteration evaluates the
      next batch at the current parameters before stepping::

          loss_fn(model, next_batch).backward()   # (clip gradients here as for the step)
          optimizer.stash_lookahead_grad()        # remembered for the next step
          optimizer.zero_grad()
          loss_fn(model, batch).backward()        # (clip)
          optimizer.step()                        # uses the stash from the previous iteration
          optimizer.zero_grad()

      The official call names ``update_previous_grad()`` (= ``stash_lookahead_grad()``) and
      ``update_last_grad()`` work too; ``step()`` already promotes the stash, so a later
      ``update_last_grad()`` changes nothing.

    State (float32 for bfloat16/float16/float32 parameters, float64 for float64 ones, whose updates are computed
    in float64): ``step`` (int, per tensor), ``exp_avg``, ``exp_avg_sq`` (when the rule needs it),
    ``max_exp_avg_sq`` (amsgrad), ``last_grad`` and, in the exact scheme, ``previous_grad`` (the stash).

    A param group may set any hyperparameter of its own, and takes the constructor's for the others (a group that
    sets ``lr`` keeps the constructor's ``lr_1d``, as its ratio to the group's own lr). ``is_approx``, ``backend``,
    ``process_group``, ``ns_cuda_graph`` and ``ns_batch`` hold for the whole optimizer: a group that sets one is
    refused with a ValueError. ``lr`` and ``lr_1d`` may be 1-element tensors, read as floats once per step
    (``lr_1d`` when the group is created, or when it is written into the group between steps).

    Args:
        params: parameters or parameter groups.
        lr: learning rate of the MARS rule (a float or a 1-element tensor).
        betas: (beta1, beta2) of the MARS rule.
        eps: added to the Adam denominator (and the Newton-Schulz normalisation guard for mars-shampoo).
        weight_decay: decoupled weight decay of the MARS rule.
        amsgrad: divide by the running maximum of the second moment.
        gamma: strength of the variance-reduction correction (0 gives Adam/Lion/Shampoo with a norm clip).
        is_approx: approximate scheme (True) or exact scheme (False), see above.
        mars_type: ``"mars-adamw"``, ``"mars-lion"`` or ``"mars-shampoo"``.
        optimize_1d: also apply the MARS rule to tensors that are not 2-D.
        lr_1d, betas_1d, weight_decay_1d: AdamW settings of tensors that are not 2-D; ``lr_1d`` is the 1-D rate at
            the group's lr when it is created, kept as ``group["lr_1d_ratio"]`` (see above).
        backend: ``"reference"`` (per-tensor loop of :mod:`mars.reference`), ``"torch"`` (foreach ops),
            ``"triton"`` (fused kernels; CUDA, or CPU under ``TRITON_INTERPRET=1``) or ``"auto"``
            (triton for CUDA tensors when it is installed, torch otherwise); float64 parameters, which the Triton
            kernels do not take, step with torch under ``"triton"``. mars-shampoo's 2-D tensors
            take Newton-Schulz by torch matmuls (:func:`mars.newton_schulz.orthogonalise`), one tensor at a time
            (same-shaped ones batched with ``ns_batch``).
        process_group: under DDP (every rank holding the same gradients), mars-shampoo shares its
            Newton-Schulz work out across this group's ranks; the other rules are unaffected. Held weakly
            (:class:`WeakProcessGroup`): the optimizer does not keep the group alive past its destruction.
        ns_dtype: mars-shampoo's Newton-Schulz dtype: the official bfloat16, or float32 (~10x faster on CPUs
            without bfloat16 matrix units, and deterministic enough to compare batched with one-by-one).
        ns_form: the product order of mars-shampoo's Newton-Schulz with the fast backends
            (:data:`mars.newton_schulz.NS_FORMS`): the authors' ``"products"``, or ``"fused_gram"`` (fewer flops
            and kernels, half the bfloat16 rounding error). ``backend="reference"`` always takes the authors'.
        ns_cuda_graph: run each group's mars-shampoo Newton-Schulz as one CUDA graph (CUDA only), as
            :class:`mars.Muon`'s; not with ``backend="reference"``.
        ns_batch: orthogonalise mars-shampoo's matrices of one shape together, as one batch, as
            :class:`mars.Muon`'s; not with ``backend="reference"``.
    """

    OPTIMIZER_OPTIONS = ("is_approx", "backend", "process_group", "ns_cuda_graph", "ns_batch")
    # The backends' MARS rule, mars-shampoo's rule of 2-D tensors (Newton-Schulz), AdamW.
    RULES = ("backend_mars", "shampoo_2d", "adamw")
    RULE_KEYS = ("optimize_1d", "mars_type")
    CORRECTED_RULES = ("backend_mars", "shampoo_2d")
    LEARNING_RATES = ("lr", "lr_1d")
    FOLLOWING_LRS = ("lr_1d",)

    def __init__(
        self,
        params,
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.95, 0.99),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        gamma: float = 0.025,
        is_approx: bool = True,
        mars_type: str = "mars-adamw",
        optimize_1d: bool = False,
        lr_1d: float = 3e-3,
        betas_1d: tuple[float, float] = (0.9, 0.95),
        weight_decay_1d: float = 0.1,
        backend: str = "auto",
        process_group: dist.ProcessGroup | None = None,
        ns_dtype: torch.dtype = torch.bfloat16,
        ns_form: str = "products",
        ns_cuda_graph: bool = False,
        ns_batch: bool = False,
    ):
        if ns_cuda_graph is True and backend == "reference":  # another value than a bool: refused by the base
            raise ValueError("ns_cuda_graph=True captures the fast backends' Newton-Schulz; backend='reference' runs "
                             "the reference tensor by tensor: take backend='torch' or 'auto', or ns_cuda_graph=False")
        if ns_batch is True and backend == "reference":
            raise ValueError("ns_batch=True batches the fast backends' Newton-Schulz; backend='reference' runs the "
                             "reference tensor by tensor: take backend='torch' or 'auto', or ns_batch=False")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "triton" and not triton_is_installed():
            raise ValueError("backend='triton' needs the triton package; install it or use backend='torch'")
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, gamma=gamma,
            mars_type=mars_type, optimize_1d=optimize_1d, lr_1d=lr_1d, betas_1d=betas_1d,
            weight_decay_1d=weight_decay_1d, ns_dtype=ns_dtype, ns_form=ns_form,
        )
        super().__init__(params, defaults, is_approx=is_approx, backend=backend, process_group=process_group,
                         ns_cuda_graph=ns_cuda_graph, ns_batch=ns_batch)

    def _check_group(self, group: dict[str, Any]) -> None:
        check_non_negative(
            eps=group["eps"], weight_decay=group["weight_decay"], gamma=group["gamma"],
            weight_decay_1d=group["weight_decay_1d"],
        )
        check_betas("betas", group["betas"])
        check_betas("betas_1d", group["betas_1d"])
        check_ns_dtype(group["ns_dtype"])
        check_ns_form(group["ns_form"], norm_in_dtype=False)  # mars-shampoo normalises by the float32 norm
        if group["mars_type"] not in reference.MARS_TYPES:
            raise ValueError(f"mars_type must be one of {reference.MARS_TYPES}, got {group['mars_type']!r}")

    def _steps_eagerly(self, group: dict[str, Any]) -> bool:
        # The Triton launches read the tensors' data pointers, which traced tensors do not have. (A group whose
        # tensors Triton would leave to torch, float64 ones, runs eagerly too: the same numbers.)
        if self.backend == "triton":
            return True
        return self.backend == "auto" and triton_is_installed() and any(param.is_cuda for param in group["params"])

    def _rule(self, param: Tensor, group: dict[str, Any]) -> str:
        if not reference.uses_mars_rule(param, group["optimize_1d"]):
            return "adamw"
        if group["mars_type"] == "mars-shampoo" and param.dim() == 2:
            return "shampoo_2d"
        return "backend_mars"

    def _step_group(self, group: dict[str, Any], *, backend_mars: list[Tensor], shampoo_2d: list[Tensor],
                    adamw: list[Tensor]) -> None:
        """Run the group's tensors through their backends by device."""
        mars_type, amsgrad = group["mars_type"], group["amsgrad"]
        # mars-shampoo's tensors that are not 2-D take the AdamW-style MARS rule, as in the official code.
        backend_mars_type = "mars-adamw" if mars_type == "mars-shampoo" else mars_type
        beta1, beta2 = group["betas"]
        lr = step_lr(group["lr"])
        mars_hyper = dict(
            lr=lr, beta1=beta1, beta2=beta2, eps=group["eps"], weight_decay=group["weight_decay"],
            gamma=group["gamma"], amsgrad=amsgrad, remember_grad=self.is_approx,
        )
        ns_dtype, ns_form = group["ns_dtype"], group["ns_form"]
        for backend, params in self._by_backend(backend_mars):
            self._run_mars(backend, params, mars_type=backend_mars_type, **mars_hyper)
        if shampoo_2d and self.backend == "reference" and self.process_group is None:
            self._run_mars(REFERENCE_BACKEND, shampoo_2d, mars_type="mars-shampoo", ns_dtype=ns_dtype, **mars_hyper)
        elif shampoo_2d:
            self._run_shampoo_2d(shampoo_2d, ns_dtype=ns_dtype, ns_form=ns_form,
                                 graph=self._newton_schulz_graph(group), **mars_hyper)

        beta1_1d, beta2_1d = group["betas_1d"]
        for backend, params in self._by_backend(adamw):
            states = self._states(params)
            backend.adamw_group_step(
                params, [p.grad for p in params],
                state_buffers(params, states, "exp_avg"), state_buffers(params, states, "exp_avg_sq"),
                state_buffers(params, states, "max_exp_avg_sq", needed=amsgrad),
                steps=advance_steps(params, states), lr=following_rate(group, "lr_1d"), beta1=beta1_1d,
                beta2=beta2_1d, eps=group["eps"], weight_decay=group["weight_decay_1d"], amsgrad=amsgrad,
            )

    def _run_mars(self, backend: Any, params: list[Tensor], *, mars_type: str, amsgrad: bool, **hyper) -> None:
        """Run the MARS rule of ``backend`` on ``params``, creating missing state first."""
        has_second_moment = mars_type != "mars-lion"
        states = self._states(params)
        backend.mars_group_step(
            params, [p.grad for p in params],
            state_buffers(params, states, "last_grad"), state_buffers(params, states, "exp_avg"),
            state_buffers(params, states, "exp_avg_sq", needed=has_second_moment),
            state_buffers(params, states, "max_exp_avg_sq", needed=amsgrad and has_second_moment),
            steps=advance_steps(params, states), mars_type=mars_type, amsgrad=amsgrad and has_second_moment,
            **hyper,
        )

    def _run_shampoo_2d(self, params: list[Tensor], *, lr: float, beta1: float, eps: float, weight_decay: float,
                        gamma: float, remember_grad: bool, ns_dtype: torch.dtype, ns_form: str,
                        graph: CapturedLists | None, **_) -> None:
        """mars-shampoo on 2-D tensors, as :func:`mars.reference.mars_step`: the elementwise part over whole lists
        (:mod:`mars.shampoo_foreach`, no host sync), Newton-Schulz on them all at once."""
        states = self._states(params)
        advance_steps(params, states)
        directions = shampoo_foreach.shampoo_directions(
            [param.grad for param in params], state_buffers(params, states, "last_grad"),
            state_buffers(params, states, "exp_avg"), gamma=gamma, beta1=beta1, remember_grad=remember_grad)
        # The official code passes the optimizer's eps to Newton-Schulz as its normalisation guard. The results come
        # back in the widest state dtype (float64 with float64 parameters), each then cast to its own state's.
        out_dtype = functools.reduce(torch.promote_types, (direction.dtype for direction in directions))
        updates = orthogonalise(directions, dtype=ns_dtype, process_group=self.process_group, eps=eps, form=ns_form,
                                out_dtype=out_dtype, batch=self.ns_batch, graph=graph)
        shampoo_foreach.apply_shampoo_updates(params, updates, lr=lr, weight_decay=weight_decay)

    def _by_backend(self, params: list[Tensor]) -> list[tuple[ModuleType | SimpleNamespace, list[Tensor]]]:
        """Parameters grouped by the backend that steps them (each backend call takes tensors on one device); kept
        with the plan (:meth:`_planned`), as are the groups' state dicts."""
        def by_backend(params: list[Tensor]) -> list[tuple[ModuleType | SimpleNamespace, list[Tensor]]]:
            batches: dict[tuple[torch.device, bool], list[Tensor]] = defaultdict(list)
            for param in params:
                batches[param.device, param.dtype == torch.float64].append(param)
            return [(self._backend_for(device, float64), batch) for (device, float64), batch in batches.items()]

        batches = self._planned(("backends", self.backend), params, by_backend)
        if self._is_planned(params):
            self._keep_as_planned(batch for _, batch in batches)
        return batches

    def _backend_name(self, device: torch.device, float64: bool = False) -> str:
        """The name of the backend that steps tensors on ``device`` (of float64 parameters, with ``float64``)."""
        name = self.backend
        if name == "auto":
            name = "triton" if device.type == "cuda" and triton_is_installed() else "torch"
        if name == "triton" and float64:
            name = "torch"  # the kernels compute in float32; torch's foreach ops keep float64 (the same rule)
        return name

    def _backend_for(self, device: torch.device, float64: bool = False) -> ModuleType | SimpleNamespace:
        """The backend module for tensors on ``device`` (of float64 parameters, with ``float64``); never falls back
        silently to other math."""
        name = self._backend_name(device, float64)
        if name == "reference":
            return REFERENCE_BACKEND
        if name == "torch":
            return torch_backend  # imported with this module: a traced step does not reach importlib
        if name == "triton" and device.type != "cuda" and not triton_interpreter_enabled():
            raise RuntimeError(
                f"backend='triton' got tensors on {device}; Triton runs on CUDA, or on the CPU only with the "
                "environment variable TRITON_INTERPRET=1 (slow, for tests). Use backend='torch' on the CPU."
            )
        return importlib.import_module(f"mars.{name}_backend")


def state_buffers(params: list[Tensor], states: list[dict[str, Any]], key: str,
                  needed: bool = True) -> list[Tensor] | None:
    """Each parameter's float32 state buffer ``key`` (zeros when new), or None when the rule has no use for it."""
    if not needed:
        return None
    try:
        return [state[key] for state in states]  # after the first step, every buffer is there
    except KeyError:
        for param, state in zip(params, states):
            if key not in state:
                state[key] = state_zeros_like(param)
        return [state[key] for state in states]


def each_tensor(rule: Callable[..., Any]) -> Callable[..., list[Any]]:
    """The list form of a per-tensor ``rule``: ``rule`` applied to the tensors at each index of the lists."""
    return lambda *lists, **hyper: [rule(*tensors, **hyper) for tensors in zip(*lists)]
