"""Every optimizer that mars exports, with every backend and path, against the conventions of ``torch.optim`` that
generic optimizer tests (timm's ``tests/test_optim.py``, pytorch_optimizer's) hold a drop-in optimizer to."""
import copy
import importlib
import inspect
import pickle
import pkgutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.optim import lr_scheduler

import mars
from mars import MARS, MarsM, Muon, available_backends
from mars.optimizer import BACKENDS, LookaheadGradient
from mars.traits import trait
from tests.mars import saved_state_dicts

needs_triton = pytest.mark.skipif("triton" not in available_backends("cpu"),
                                  reason="needs triton and TRITON_INTERPRET=1 (set by tests/conftest.py)")
triton_case = [needs_triton, pytest.mark.triton_interpreter]


def optimizers_of_mars() -> list[type]:
    """Every optimizer the modules of ``mars`` define, exported or not: the public ``torch.optim.Optimizer`` classes
    built from their parameters alone (not a base such as ``DispatchingOptimizer``, which takes ``defaults``)."""
    modules = [importlib.import_module(f"mars.{module.name}") for module in pkgutil.iter_modules(mars.__path__)]
    return [cls for module in modules for name, cls in vars(module).items()
            if inspect.isclass(cls) and cls.__module__ == module.__name__ and not name.startswith("_")
            and issubclass(cls, torch.optim.Optimizer) and "defaults" not in inspect.signature(cls).parameters]


def other_paths(cls) -> list[dict]:
    """The constructor options that step ``cls`` by another path than its default on the CPU, read from its
    arguments: each other explicit backend (``auto`` takes ``torch`` here), ``foreach=False`` beside the foreach
    default, and mars-shampoo (its matrices take Newton-Schulz, a path of their own) on two backends."""
    arguments = inspect.signature(cls).parameters
    paths = [dict(foreach=False)] if "foreach" in arguments else []
    if "backend" in arguments:
        paths += [dict(backend=backend) for backend in BACKENDS if backend not in ("auto", "torch")]
    if "mars_type" in arguments:
        paths += [dict(backend=backend, mars_type="mars-shampoo") for backend in ("reference", "torch")]
    return paths


def case(cls, options):
    marks = triton_case if options.get("backend") == "triton" else []
    name = "-".join([cls.__name__, *(str(value) for value in options.values())])
    return pytest.param(cls, options, id=name, marks=marks)


# (optimizer class, constructor options): every optimizer of mars with its default path, then its others.
OPTIMIZERS = [case(cls, options) for cls in optimizers_of_mars() for options in [{}, *other_paths(cls)]]
# Those whose updates are the lr times an lr-free direction (mars/traits.py): schedulers scale them, lr 0 freezes.
LINEAR_IN_LR = [case for case in OPTIMIZERS if trait(case.values[0], "UPDATES_LINEAR_IN_LR")]
# A matrix and a vector, so that both rules of every optimizer step (the matrix rule and its AdamW part).
SHAPES = [(5, 3), (3,)]
# Large then small gradients: the norm clips act, and a second moment falls (amsgrad keeps its maximum).
GRAD_SCALES = [3.0, 0.01, 0.01, 0.5]
STEPS = len(GRAD_SCALES)


def new_params(dtype=torch.float32, shapes=SHAPES, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype))
            for shape in shapes]


def clone_params(params):
    return [torch.nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad) for param in params]


def gradients(params, step):
    """The gradients of ``step`` (a seeded function of the step), in each parameter's dtype."""
    generator = torch.Generator().manual_seed(1000 + step)
    scale = GRAD_SCALES[step % len(GRAD_SCALES)]
    return [(torch.randn(param.shape, generator=generator, dtype=torch.float64) * scale).to(param.dtype)
            for param in params]


def run_steps(optimizer, params, steps):
    """Step ``optimizer`` at each of ``steps``, every parameter that requires a gradient getting one."""
    for step in steps:
        for param, grad in zip(params, gradients(params, step)):
            param.grad = grad if param.requires_grad else None
        optimizer.step()
        optimizer.zero_grad()


def learning_rates(cls):
    """The constructor arguments of ``cls`` that are learning rates, as the class names them (``LEARNING_RATES``:
    ``lr``, MARS's ``lr_1d``, Muon's ``adamw_lr``)."""
    return list(cls.LEARNING_RATES)


def assert_same_params(actual, expected):
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype
        torch.testing.assert_close(a.detach(), e.detach(), rtol=0, atol=0)


def assert_same_state_dict(actual, expected):
    """Equal param groups (the same keys and values) and equal state, tensors bit for bit in the same dtype."""
    assert actual["param_groups"] == expected["param_groups"]
    assert actual["state"].keys() == expected["state"].keys()
    for index, state in expected["state"].items():
        assert actual["state"][index].keys() == state.keys()
        for key, value in state.items():
            if torch.is_tensor(value):
                assert actual["state"][index][key].dtype == value.dtype, key
                torch.testing.assert_close(actual["state"][index][key], value, rtol=0, atol=0)
            else:
                assert actual["state"][index][key] == value


def test_every_exported_optimizer_is_covered():
    covered = {param.values[0] for param in OPTIMIZERS}
    exported = {getattr(mars, name) for name in mars.__all__}
    assert {cls for cls in exported if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)} <= covered
    assert {MARS, Muon, MarsM} <= covered


def test_every_optimizer_of_a_module_of_mars_imports_from_mars():
    # `from mars import <Name>` for a new rule in mars/<name>.py, without a line in mars/__init__.py.
    assert all(getattr(mars, cls.__name__) is cls for cls in optimizers_of_mars())
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchOptimizer'"):
        mars.NoSuchOptimizer  # noqa: B018


def stepped_twice(cls, options):
    """Parameters, ``cls(params, **options)`` after two steps on them, and a copy of its state dict then."""
    params = new_params()
    optimizer = cls(params, **options)
    run_steps(optimizer, params, range(2))
    return params, optimizer, copy.deepcopy(optimizer.state_dict())


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_state_dict_loaded_into_a_fresh_optimizer_is_returned_unchanged_and_steps_identically(cls, options):
    params, optimizer, saved = stepped_twice(cls, options)

    fresh_params = clone_params(params)
    fresh = cls(fresh_params, **options)
    fresh.load_state_dict(copy.deepcopy(saved))
    assert_same_state_dict(fresh.state_dict(), saved)

    run_steps(optimizer, params, range(2, STEPS))
    run_steps(fresh, fresh_params, range(2, STEPS))
    assert_same_params(fresh_params, params)
    assert_same_state_dict(fresh.state_dict(), optimizer.state_dict())


# State dicts saved by earlier versions (tests/mars/saved_state_dicts.py says how): 7554a9e kept MARS's lr_1d and
# Muon's adamw_lr as a ratio to lr, as this version does; 07c07da kept them as rates of their own.
SAVED_BY = {version: Path(__file__).with_name(f"state_dicts_{version}.pt") for version in ("7554a9e", "07c07da")}


@pytest.mark.parametrize("version", SAVED_BY)
@pytest.mark.parametrize("case", saved_state_dicts.CASES)
def test_a_state_dict_saved_by_an_earlier_version_loads_and_steps_as_that_version_did(case, version):
    saved = torch.load(SAVED_BY[version], weights_only=True)[case]
    params = [torch.nn.Parameter(param) for param in saved["params"]]
    optimizer = saved_state_dicts.new_optimizer(case, params)
    optimizer.load_state_dict(copy.deepcopy(saved["state_dict"]))
    # A saved rate comes back as its ratio to the group's lr: the rate it stepped with, at that lr.
    expected = copy.deepcopy(saved["state_dict"])
    for group in expected["param_groups"]:
        for name in type(optimizer).FOLLOWING_LRS:
            if name in group:
                group[f"{name}_ratio"] = group.pop(name) / group["lr"]
    assert_same_state_dict(optimizer.state_dict(), expected)
    saved_state_dicts.step(optimizer, params, saved_state_dicts.SAVED_AFTER)
    for param, expected in zip(params, saved["stepped"]):
        torch.testing.assert_close(param.detach(), expected)


def custom_subclass(cls):
    """A subclass as users write them: its constructor names none of the options it passes on."""
    def __init__(self, params, **options):
        cls.__init__(self, params, **options)

    return type(f"Custom{cls.__name__}", (cls,), {"__init__": __init__, "__module__": __name__})


SUBCLASSES = {cls: custom_subclass(cls) for cls in optimizers_of_mars()}
globals().update({subclass.__name__: subclass for subclass in SUBCLASSES.values()})  # for pickle to find by name
COPIES = {"deepcopy": copy.deepcopy, "pickle": lambda obj: pickle.loads(pickle.dumps(obj))}


@pytest.mark.parametrize("subclass", [False, True], ids=["class", "subclass"])
@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_copy_or_pickle_steps_as_the_original(cls, options, how, subclass):
    params = new_params()
    optimizer = (SUBCLASSES[cls] if subclass else cls)(params, **options)
    run_steps(optimizer, params, range(2))
    copied_params, copied = COPIES[how]((params, optimizer))
    assert type(copied) is type(optimizer)
    assert_same_state_dict(copied.state_dict(), optimizer.state_dict())

    run_steps(optimizer, params, range(2, STEPS))
    run_steps(copied, copied_params, range(2, STEPS))
    assert_same_params(copied_params, params)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_state_dict_whose_groups_lack_an_option_is_refused_naming_it_and_the_fix(cls, options):
    params, optimizer, before = stepped_twice(cls, options)
    lacking = copy.deepcopy(before)
    option = list(optimizer.defaults)[-1]
    del lacking["param_groups"][0][option]  # as a state dict saved before the option existed
    with pytest.raises(ValueError, match=f"param group 0 of the state dict has no '{option}'.*Add '{option}' to every "
                                         f"saved param group.*{optimizer.defaults[option]!r} is this optimizer's"):
        optimizer.load_state_dict(lacking)
    assert_same_state_dict(optimizer.state_dict(), before)
    another = MarsM if cls is Muon else Muon
    with pytest.raises(ValueError, match=f"saved by another optimizer than {another.__name__}"):
        another(clone_params(params)).load_state_dict(before)


# The exact scheme: each step needs the look-ahead gradient stashed before it.
EXACT_SCHEME = [pytest.param(cls, dict(is_approx=False), id=cls.__name__) for cls in optimizers_of_mars()
                if issubclass(cls, LookaheadGradient)]


def stash_lookahead(optimizer, params, step):
    for param, grad in zip(params, gradients(params, step)):
        param.grad = grad
    optimizer.stash_lookahead_grad()
    optimizer.zero_grad()


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("cls, options", EXACT_SCHEME)
def test_a_stashed_lookahead_gradient_survives_a_copy_or_pickle(cls, options, how):
    params = new_params()
    optimizer = cls(params, **options)
    stash_lookahead(optimizer, params, 1)
    run_steps(optimizer, params, range(1))
    stash_lookahead(optimizer, params, 2)
    copied_params, copied = COPIES[how]((params, optimizer))
    run_steps(optimizer, params, range(1, 2))
    run_steps(copied, copied_params, range(1, 2))
    assert_same_params(copied_params, params)
    assert_same_state_dict(copied.state_dict(), optimizer.state_dict())


@pytest.mark.parametrize("cls, options", EXACT_SCHEME)
def test_a_loaded_state_dict_steps_only_after_a_stash_of_its_own(cls, options):
    params = new_params()
    optimizer = cls(params, **options)
    stash_lookahead(optimizer, params, 1)
    run_steps(optimizer, params, range(1))
    saved = copy.deepcopy(optimizer.state_dict())
    stash_lookahead(optimizer, params, 2)
    optimizer.load_state_dict(saved)  # the stash belonged to the state it replaced
    with pytest.raises(RuntimeError, match="stash_lookahead_grad"):
        run_steps(optimizer, params, range(1, 2))


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_param_group_added_later_steps_as_one_given_at_construction_without_a_gradient_until_then(cls, options):
    matrix, vector = new_params()
    optimizer = cls([matrix], **options)
    run_steps(optimizer, [matrix], range(1))
    optimizer.add_param_group({"params": [vector]})
    run_steps(optimizer, [matrix, vector], range(1, STEPS))

    expected_matrix, expected_vector = new_params()
    expected = cls([{"params": [expected_matrix]}, {"params": [expected_vector]}], **options)
    run_steps(expected, [expected_matrix], range(1))
    run_steps(expected, [expected_matrix, expected_vector], range(1, STEPS))
    assert_same_params([matrix, vector], [expected_matrix, expected_vector])


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_zero_grad_sets_gradients_to_none_or_zeroes_them_in_place(cls, options):
    params = new_params()
    optimizer = cls(params, **options)
    for param, grad in zip(params, gradients(params, 0)):
        param.grad = grad
    grads = [param.grad for param in params]
    optimizer.zero_grad(set_to_none=False)
    for param, grad in zip(params, grads):
        assert param.grad is grad and not param.grad.any()
    optimizer.zero_grad()
    assert all(param.grad is None for param in params)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_parameter_without_a_gradient_is_left_alone_and_gets_no_state(cls, options):
    params = new_params()
    without_grad = torch.nn.Parameter(torch.ones(4, 2))
    optimizer = cls([*params, without_grad], **options)
    run_steps(optimizer, params, range(STEPS))
    assert torch.equal(without_grad.detach(), torch.ones(4, 2))
    assert without_grad not in optimizer.state


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_frozen_and_a_zero_dim_parameter(cls, options):
    params = new_params()
    frozen = torch.nn.Parameter(torch.ones(3, 3), requires_grad=False)
    scalar = torch.nn.Parameter(torch.tensor(1.5))
    optimizer = cls([*params, frozen, scalar], **options)
    run_steps(optimizer, [*params, frozen, scalar], range(STEPS))
    assert torch.equal(frozen, torch.ones(3, 3)) and frozen not in optimizer.state
    assert scalar.shape == () and scalar.item() != 1.5 and torch.isfinite(scalar)
    assert optimizer.state[scalar]


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_step_with_a_closure_returns_its_loss_and_steps_on_its_gradients(cls, options):
    params = new_params()
    targets = gradients(params, 0)

    def loss_of(ps):
        return sum(((p - t) ** 2).sum() for p, t in zip(ps, targets))

    optimizer = cls(params, **options)

    def closure():
        optimizer.zero_grad()
        loss = loss_of(params)
        loss.backward()
        return loss

    expected_params = clone_params(params)
    expected = cls(expected_params, **options)
    for _ in range(3):
        with torch.enable_grad():
            expected_loss = loss_of(expected_params)
        expected_loss.backward()
        expected.step()
        expected.zero_grad()
        loss = optimizer.step(closure)
        assert torch.equal(loss.detach(), expected_loss.detach())
    assert_same_params(params, expected_params)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_tensor_lr_steps_as_the_same_float_lr(cls, options):
    lr = torch.tensor(2e-3)
    params, expected_params = new_params(), new_params()
    optimizer = cls(params, **options, lr=lr)
    expected = cls(expected_params, **options, lr=lr.item())
    run_steps(optimizer, params, range(STEPS))
    run_steps(expected, expected_params, range(STEPS))
    assert_same_params(params, expected_params)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_tensor_for_every_learning_rate_steps_as_the_same_floats(cls, options):
    lrs = {name: torch.tensor(1e-2 / (index + 1)) for index, name in enumerate(learning_rates(cls))}
    params, expected_params = new_params(), new_params()
    optimizer = cls(params, **options, **lrs)
    expected = cls(expected_params, **options, **{name: lr.item() for name, lr in lrs.items()})
    run_steps(optimizer, params, range(STEPS))
    run_steps(expected, expected_params, range(STEPS))
    assert_same_params(params, expected_params)


def out_of_range_arguments() -> list:
    """(class, argument, value) for every float and pair argument of every optimizer of mars: a negative float, a
    pair whose first beta is above 1."""
    cases = []
    for cls in optimizers_of_mars():
        for name, argument in list(inspect.signature(cls.__init__).parameters.items())[2:]:
            if isinstance(argument.default, float) and not isinstance(argument.default, bool):
                cases.append(pytest.param(cls, name, -1.0, id=f"{cls.__name__}-{name}"))
            elif isinstance(argument.default, tuple) and len(argument.default) == 2:
                cases.append(pytest.param(cls, name, (1.5, 0.9), id=f"{cls.__name__}-{name}"))
    return cases


@pytest.mark.parametrize("cls, name, value", out_of_range_arguments())
def test_an_out_of_range_argument_is_named_before_params_is_read(cls, name, value):
    # As torch's Adam names a bad lr whatever params is: with params=None, torch's own TypeError came first.
    with pytest.raises(ValueError, match=name):
        cls(None, **{name: value})


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_learning_rate_tensor_of_more_than_one_element_is_refused_naming_it(cls, options):
    for name in learning_rates(cls):
        with pytest.raises(ValueError, match=f"^Tensor {name} must be 1-element"):
            cls(new_params(), **options, **{name: torch.tensor([1e-3, 1e-3])})
        with pytest.raises(ValueError, match=f"^Tensor {name} must be 1-element"):
            cls([{"params": new_params(), name: torch.tensor([1e-3, 1e-3])}], **options)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_group_that_sets_only_lr_takes_every_other_learning_rate_from_the_constructor(cls, options):
    # torch.optim's rule: a group falls back to the constructor's value of what it does not set, so a tiny
    # constructor lr has no bearing on a group with its own (MARS's lr_1d and Muon's adamw_lr included).
    params, expected_params = new_params(), new_params()
    run_steps(cls([{"params": params, "lr": 1e-3}], **options, lr=1e-28), params, range(STEPS))
    run_steps(cls(expected_params, **options, lr=1e-3), expected_params, range(STEPS))
    assert all(torch.isfinite(param).all() for param in params)
    assert_same_params(params, expected_params)


@pytest.mark.parametrize("cls, options", LINEAR_IN_LR)
def test_an_lr_changed_in_param_groups_holds_from_the_next_step(cls, options):
    params = new_params()
    optimizer = cls(params, **options)
    first = 1 + trait(cls, "STATE_ONLY_STEPS")  # the steps before the one at lr 0 (ADOPT's first moves nothing)
    run_steps(optimizer, params, range(first))
    for group in optimizer.param_groups:
        group.update(dict.fromkeys(learning_rates(cls), 0.0))
    before = [param.detach().clone() for param in params]
    run_steps(optimizer, params, range(first, first + 1))
    assert_same_params(params, before)
    for group in optimizer.param_groups:
        group.update(dict.fromkeys(learning_rates(cls), 1e-2))
    run_steps(optimizer, params, range(first + 1, first + 2))
    assert all(not torch.equal(param, old) for param, old in zip(params, before))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_parameters_keep_their_dtype_and_state_is_float32_or_float64_for_float64(cls, options, dtype):
    if dtype == torch.bfloat16 and options.get("backend") == "triton":
        pytest.skip("the Triton interpreter truncates float32 -> bfloat16 casts; test_triton_backend covers bfloat16")
    params = new_params(dtype)
    optimizer = cls(params, **options)
    run_steps(optimizer, params, range(STEPS))
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    for param in params:
        assert param.dtype == dtype
        assert all(value.dtype == state_dtype for value in optimizer.state[param].values()
                   if torch.is_tensor(value) and value.is_floating_point())


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_float64_parameters_are_not_rounded_to_float32(cls, options):
    if trait(cls, "UPDATES_LINEAR_IN_LR"):  # (lr 0 moves schedule-free's average on)
        params = new_params(torch.float64)
        optimizer = cls(params, **options)
        optimizer.param_groups[0].update(dict.fromkeys(learning_rates(cls), 0.0))
        run_steps(optimizer, params, range(STEPS))
        assert_same_params(params, new_params(torch.float64))  # a step of length zero changes nothing

    params = new_params(torch.float64)
    optimizer = cls(params, **options)
    run_steps(optimizer, params, range(STEPS))
    for param in params:
        assert not torch.equal(param, param.float().double())


@pytest.mark.parametrize("cls, options", [case for case in OPTIMIZERS if case.values[1].get("backend") != "reference"
                                          and case.values[0] is MARS])
def test_float64_parameters_take_the_reference_rule_in_float64(cls, options):
    params, expected_params = new_params(torch.float64), new_params(torch.float64)
    run_steps(cls(params, **options), params, range(STEPS))
    run_steps(cls(expected_params, **{**options, "backend": "reference"}), expected_params, range(STEPS))
    for param, expected in zip(params, expected_params):
        torch.testing.assert_close(param, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_complex_parameters_are_refused_naming_the_workaround(cls, options):
    with pytest.raises(ValueError, match="complex.*view_as_real"):
        cls([torch.nn.Parameter(torch.zeros(3, 2, dtype=torch.complex64))], **options)
    optimizer = cls(new_params(), **options)
    with pytest.raises(ValueError, match="complex.*view_as_real"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.complex64))]})


# Constructor arguments of the optimizers but the parameters (group_value derives the others): a value other than
# the default that a param group may set, or None for an option of the whole optimizer, which a group must refuse.
GROUP_VALUES = {
    "lr": "doubled",
    # eps: large enough to change the steps whether it is added to the denominator (Adam) or a floor under it (ADOPT).
    "betas": (0.8, 0.9), "eps": 1.0, "weight_decay": 0.3, "amsgrad": True, "gamma": 0.5, "mars_type": "mars-lion",
    "optimize_1d": True, "lr_1d": 1e-4, "betas_1d": (0.8, 0.9), "weight_decay_1d": 0.3, "ns_dtype": torch.float32,
    "ns_form": "fused_gram", "momentum": 0.8, "nesterov": False, "adamw_lr": 1e-4,
    "adamw_betas": (0.8, 0.9), "adamw_eps": 1e-3, "adamw_weight_decay": 0.3, "adamw_variant": "torch",
    "update_dtype": torch.float32, "clip_c": False, "matrix_rule": False,
    "is_approx": None, "backend": None, "process_group": None, "ns_cuda_graph": None, "ns_batch": None,
    "foreach": None,
}
# Values other than the defaults of the options of the whole optimizer.
OTHER_THAN_DEFAULT = {"is_approx": False, "backend": "reference", "process_group": "another group",
                      "ns_cuda_graph": True, "ns_batch": True, "foreach": False}
# mars-shampoo, so that every MARS option shows in the steps (ns_dtype and ns_form too).
GROUP_BASE = {cls: {} for cls in optimizers_of_mars()} | {MARS: dict(mars_type="mars-shampoo", backend="torch")}
CONSTRUCTOR_ARGUMENTS = [pytest.param(cls, name, id=f"{cls.__name__}-{name}") for cls in GROUP_BASE
                         for name in list(inspect.signature(cls.__init__).parameters)[2:]]


def group_value(cls, name):
    """``GROUP_VALUES[name]``, or for an argument it does not name, a value other than its default by its type."""
    if name in GROUP_VALUES:
        return GROUP_VALUES[name]
    default = inspect.signature(cls.__init__).parameters[name].default
    if isinstance(default, bool):
        return not default
    if isinstance(default, float):
        return default / 2 if default else 0.1
    if isinstance(default, int):  # a count (ns_steps): one fewer, or one more than 1
        return default - 1 if default > 1 else default + 1
    assert isinstance(default, tuple) and len(default) == 2, f"new argument {name}: add it to GROUP_VALUES"
    return (0.8, 0.9)  # a pair of betas


def constructor_options(cls, name):
    """The constructor options that give every tensor what a group with ``group_value(cls, name)`` gives its own."""
    if name != "lr":
        return {name: group_value(cls, name)}
    return {"lr": 2 * inspect.signature(cls.__init__).parameters["lr"].default}


def trajectory(cls, groups_of, **options):
    """The parameters after ``STEPS`` steps of ``cls(groups_of(params), **GROUP_BASE[cls], **options)``."""
    params = new_params()
    run_steps(cls(groups_of(params), **{**GROUP_BASE[cls], **options}), params, range(STEPS))
    return params


@pytest.mark.parametrize("cls, name", CONSTRUCTOR_ARGUMENTS)
def test_every_constructor_argument_works_per_param_group_or_is_refused_there(cls, name):
    if group_value(cls, name) is None:
        with pytest.raises(ValueError, match=f"{name} is an option of the whole {cls.__name__}"):
            cls([{"params": new_params(), name: OTHER_THAN_DEFAULT[name]}])
        # The optimizer's own value is no conflict (ZeroRedundancyOptimizer passes every constructor argument in
        # every group).
        own = GROUP_BASE[cls].get(name, inspect.signature(cls.__init__).parameters[name].default)
        assert_same_params(trajectory(cls, lambda params: [{"params": params, name: own}]), trajectory(cls, list))
        return
    options = constructor_options(cls, name)
    by_group = trajectory(cls, lambda params: [{"params": params, name: options[name]}])
    by_constructor = trajectory(cls, list, **options)
    assert_same_params(by_group, by_constructor)
    assert any(not torch.equal(a, b) for a, b in zip(by_constructor, trajectory(cls, list)))


# torch's LR schedulers as a user attaches them, each moving lr through several values (0 among them for LambdaLR).
SCHEDULERS = {
    "LambdaLR": lambda optimizer: lr_scheduler.LambdaLR(optimizer, lambda step: (1.0, 0.5, 0.25, 0.0)[min(step, 3)]),
    "MultiplicativeLR": lambda optimizer: lr_scheduler.MultiplicativeLR(optimizer, lambda step: 0.5),
    "StepLR": lambda optimizer: lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1),
    "CosineAnnealingLR": lambda optimizer: lr_scheduler.CosineAnnealingLR(optimizer, T_max=4),
    "OneCycleLR": lambda optimizer: lr_scheduler.OneCycleLR(
        optimizer, max_lr=[2 * group["lr"] for group in optimizer.param_groups], total_steps=8),
    "LinearLR-warmup-in-SequentialLR": lambda optimizer: lr_scheduler.SequentialLR(
        optimizer, [lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=2),
                    lr_scheduler.CosineAnnealingLR(optimizer, T_max=3)], milestones=[2]),
    "ReduceLROnPlateau": lambda optimizer: lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0),
}
SCHEDULED_STEPS = 6


def step_scheduler(scheduler):
    # ReduceLROnPlateau takes the metric: a loss that never improves halves lr every step.
    if isinstance(scheduler, lr_scheduler.ReduceLROnPlateau):
        scheduler.step(1.0)
    else:
        scheduler.step()


def updates(optimizer, params):
    """Each parameter's update by one ``optimizer.step()``: before minus after."""
    before = [param.detach().clone() for param in params]
    optimizer.step()
    return [old - param.detach() for old, param in zip(before, params)]


@pytest.mark.parametrize("scheduler_name", SCHEDULERS)
@pytest.mark.parametrize("cls, options", LINEAR_IN_LR)
def test_every_learning_rate_of_a_group_follows_torchs_schedulers_in_proportion(cls, options, scheduler_name):
    # Each step's update of every tensor (the 1-D ones through MARS's lr_1d, Muon's adamw_lr) is the update the same
    # state would take at the group's first lr, times the scheduler's factor: 0 at factor 0. float64, so that the
    # updates are read to 1e-9 (every rule is linear in its learning rate). Fails on 07c07da: lr_1d stayed.
    params = new_params(torch.float64)
    optimizer = cls(params, **options)
    first_lr = optimizer.param_groups[0]["lr"]
    scheduler = SCHEDULERS[scheduler_name](optimizer)
    factors = []
    for step in range(SCHEDULED_STEPS):
        at_first_lr_params, at_first_lr = copy.deepcopy((params, optimizer))  # (a deep copy leaves out .grad)
        at_first_lr.param_groups[0]["lr"] = first_lr
        for param, copied, grad in zip(params, at_first_lr_params, gradients(params, step)):
            param.grad, copied.grad = grad, grad.clone()
        expected = updates(at_first_lr, at_first_lr_params)
        factor = optimizer.param_groups[0]["lr"] / first_lr
        moves = step >= trait(cls, "STATE_ONLY_STEPS")  # (ADOPT's first step only sets its state)
        for update, unscaled in zip(updates(optimizer, params), expected):
            assert bool(unscaled.abs().max() > 0) == moves
            if factor == 0.0:
                assert torch.equal(update, torch.zeros_like(update))
            else:
                # atol: an update is read as the difference of two float64 parameters near 1, to their ulp.
                torch.testing.assert_close(update, factor * unscaled, rtol=1e-9, atol=1e-15)
        factors.append(factor)
        optimizer.zero_grad()
        step_scheduler(scheduler)
    assert len(set(factors)) > 2, factors  # the schedule moved lr


@pytest.mark.parametrize("tensor_lr", [False, True], ids=["float-lr", "tensor-lr"])
@pytest.mark.parametrize("cls, options", LINEAR_IN_LR)
def test_lr_zero_freezes_every_tensor_of_the_group(cls, options, tensor_lr):
    # As timm's test_optimizer_zero_lr: a warmup from 0 or a cooldown to 0 leaves every parameter as it is.
    lr = torch.tensor(1e-2) if tensor_lr else 1e-2
    params = new_params()
    optimizer = cls(params, **options, lr=lr)
    run_steps(optimizer, params, range(3))
    if tensor_lr:
        lr.fill_(0.0)
    else:
        optimizer.param_groups[0]["lr"] = 0.0
    before = [param.detach().clone() for param in params]
    run_steps(optimizer, params, range(3, 6))
    assert_same_params(params, before)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_group_added_with_its_own_lr_takes_the_constructors_other_learning_rates(cls, options):
    # The rule of a group given at construction holds for add_param_group too: a tiny constructor lr has no bearing
    # on the other learning rates of a group with its own lr.
    params, expected_params = new_params(), new_params()
    optimizer = cls([torch.nn.Parameter(torch.zeros(2))], **options, lr=1e-28)
    optimizer.add_param_group({"params": params, "lr": 1e-3})
    run_steps(optimizer, params, range(STEPS))
    run_steps(cls(expected_params, **options, lr=1e-3), expected_params, range(STEPS))
    assert all(torch.isfinite(param).all() for param in params)
    assert_same_params(params, expected_params)


@pytest.mark.parametrize("cls, options", [case for case in OPTIMIZERS if case.values[0].FOLLOWING_LRS])
def test_a_groups_ratio_to_lr_is_saved_and_loaded_with_it(cls, options):
    # A group's own second learning rate, kept as its ratio to the group's lr, comes back with its state dict into an
    # optimizer built with other rates, and the next steps are the original's.
    name = cls.FOLLOWING_LRS[0]
    params = new_params()
    optimizer = cls([{"params": params, "lr": 4e-3, name: 1e-3}], **options)
    scheduler = lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    run_steps(optimizer, params, range(2))
    scheduler.step()
    assert optimizer.state_dict()["param_groups"][0][f"{name}_ratio"] == 1e-3 / 4e-3
    fresh_params = clone_params(params)
    fresh = cls(fresh_params, **options, lr=1.0, **{name: 0.5})
    fresh.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    run_steps(optimizer, params, range(2, STEPS))
    run_steps(fresh, fresh_params, range(2, STEPS))
    assert_same_params(fresh_params, params)


FOLLOWING = [case for case in OPTIMIZERS if case.values[0].FOLLOWING_LRS]


def following_rate_written_between_steps(cls, options, zero1: bool):
    """The parameters after three steps, the second rate (``lr_1d``, ``adamw_lr``) written into the group after
    the first at its value at construction (a float of its own: the value is no sign of a write) and half the group's
    lr of then, and the optimizer's record of its ratio; ``zero1``: through a ZeroRedundancyOptimizer of one rank,
    written into its groups."""
    name = cls.FOLLOWING_LRS[0]
    params = new_params()
    if zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, **options, lr=4e-3, **{name: 1e-3})
    else:
        optimizer = cls(params, **options, lr=4e-3, **{name: 1e-3})
    run_steps(optimizer, params, range(1))
    optimizer.param_groups[0]["lr"] = 2e-3
    optimizer.param_groups[0][name] = float("1e-3")
    run_steps(optimizer, params, range(1, 3))
    local = optimizer.optim if zero1 else optimizer
    return params, local.param_groups[0][f"{name}_ratio"]


@pytest.mark.parametrize("cls, options", FOLLOWING)
def test_a_second_rate_written_into_a_group_between_steps_takes_effect_at_the_next_step(cls, options):
    # As a group created with that rate at that lr: its ratio to the lr of then, from then on.
    name = cls.FOLLOWING_LRS[0]
    params, ratio = following_rate_written_between_steps(cls, options, zero1=False)
    assert ratio == 1e-3 / 2e-3
    expected_params = new_params()
    expected = cls(expected_params, **options, lr=4e-3, **{name: 1e-3})
    run_steps(expected, expected_params, range(1))
    expected.param_groups[0].update({"lr": 2e-3, f"{name}_ratio": 0.5})
    run_steps(expected, expected_params, range(1, 3))
    assert_same_params(params, expected_params)
    unwritten_params = new_params()
    unwritten = cls(unwritten_params, **options, lr=4e-3, **{name: 1e-3})
    run_steps(unwritten, unwritten_params, range(1))
    unwritten.param_groups[0]["lr"] = 2e-3
    run_steps(unwritten, unwritten_params, range(1, 3))
    assert any(not torch.equal(a, b) for a, b in zip(params, unwritten_params)), "the write changed nothing"


@pytest.mark.parametrize("cls, options", [FOLLOWING[0], *[case for case in FOLLOWING if case.values[1] == {}]])
def test_under_zero1_a_written_second_rate_takes_effect_and_the_constructors_copied_each_step_is_no_write(
        cls, options, tmp_path):
    # ZeroRedundancyOptimizer copies its groups' keys (the constructor's lr_1d among them) into its shard's groups
    # before every step: unwritten, the schedule's lr alone moves the rate; written, the write holds as without it.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        params, ratio = following_rate_written_between_steps(cls, options, zero1=True)
    finally:
        dist.destroy_process_group()
    assert ratio == 1e-3 / 2e-3
    assert_same_params(params, following_rate_written_between_steps(cls, options, zero1=False)[0])


@pytest.mark.parametrize("cls, options", FOLLOWING)
def test_a_second_rate_written_while_lr_is_zero_is_refused_naming_its_ratio(cls, options):
    name = cls.FOLLOWING_LRS[0]
    params = new_params()
    optimizer = cls(params, **options)
    optimizer.param_groups[0].update({"lr": 0.0, name: 1e-3})
    for param, grad in zip(params, gradients(params, 0)):
        param.grad = grad
    with pytest.raises(ValueError, match=f"^param group 0: {name}=0.001 was written while the group's lr is 0.*"
                                         f"set group\\['{name}_ratio'\\] instead"):
        optimizer.step()


@pytest.mark.parametrize("cls", optimizers_of_mars())
def test_a_bad_learning_rate_is_named_before_params_is_read(cls):
    # As torch's Adam: TestOptimRenewed passes params=None beside a 2-element tensor lr.
    with pytest.raises(ValueError, match="^Tensor lr must be 1-element"):
        cls(None, lr=torch.tensor([1e-3, 1e-3]))


@pytest.mark.parametrize("cls, options", [case for case in OPTIMIZERS if case.values[0].FOLLOWING_LRS])
def test_a_group_created_at_lr_zero_with_a_second_rate_is_refused_naming_both(cls, options):
    name = cls.FOLLOWING_LRS[0]
    with pytest.raises(ValueError, match=f"^{name}=0.001 with lr=0: {name} follows the group's lr as the ratio"):
        cls(new_params(), **options, lr=0.0, **{name: 1e-3})
    frozen = cls(new_params(), **options, lr=0.0, **{name: 0.0})  # nothing to follow: both rates stay 0
    params = frozen.param_groups[0]["params"]
    before = [param.detach().clone() for param in params]
    run_steps(frozen, params, range(2))
    assert_same_params(params, before)


@pytest.mark.parametrize("cls, options", OPTIMIZERS)
def test_a_first_step_on_zero_gradients_moves_nothing_without_weight_decay(cls, options):
    # As torch's test_step_is_noop_for_zero_grads. With weight decay (MarsM's default 0.1, the authors' wd) a zero-gradient step shrinks the weights, as torch's
    # AdamW does: docs/optimizers.md.
    no_decay = {name: 0.0 for name in inspect.signature(cls.__init__).parameters if "weight_decay" in name}
    params = new_params()
    optimizer = cls(params, **options, **no_decay)
    before = [param.detach().clone() for param in params]
    for param in params:
        param.grad = torch.zeros_like(param)
    optimizer.step()
    assert_same_params(params, before)
