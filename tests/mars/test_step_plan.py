"""The Python work of a step done once and kept (mars.optimizer.GroupPlan): each group's lists by rule, their state
dicts and MARS's lists by backend are built on the first step and not again while nothing they depend on changes,
and rebuilt when something does: a tensor gaining or losing its gradient, a group added or its tensors changed,
the hyperparameters that choose a rule, the state loaded, cleared or replaced.

Each change is checked against an optimizer that plans every step afresh (its plans dropped before each step, as
every step did before plans were kept): the same parameters and state, bit for bit."""
import copy
from collections import defaultdict

import pytest
import torch

from mars import MARS
from tests.mars import test_torch_conventions as torch_conventions

SHAPES = [(6, 4), (4,), (4, 6), (6, 4), (3,)]
# Every optimizer of mars on each of its CPU paths, and in the exact scheme where it has one (the conventions' cases).
OPTIMIZERS = {case.id: case.values for case in torch_conventions.OPTIMIZERS if case.values[1].get("backend") != "triton"}
OPTIMIZERS |= {f"{case.id}-exact": case.values for case in torch_conventions.EXACT_SCHEME}


class Run:
    """Parameters and an optimizer over them, stepped with seeded gradients; ``replan`` drops the optimizer's
    plans before every step."""

    def __init__(self, name, replan):
        generator = torch.Generator().manual_seed(0)
        self.params = [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]
        self.spare = torch.nn.Parameter(torch.randn(6, 4, generator=generator))  # for the group changes
        cls, options = OPTIMIZERS[name]
        self.optimizer = cls(self.params, **options)
        self.replan, self.generator = replan, torch.Generator().manual_seed(1)

    def all_params(self):
        return [param for group in self.optimizer.param_groups for param in group["params"]]

    def step(self, without_grad=()):
        """One step with fresh gradients but for the parameters at ``without_grad`` (indices into all_params)."""
        for index, param in enumerate(self.all_params()):
            grad = torch.randn(param.shape, generator=self.generator)
            param.grad = None if index in without_grad else grad
        if self.replan:
            self.optimizer._forget_plans()
        if getattr(self.optimizer, "needs_lookahead_grad", False):
            self.optimizer.stash_lookahead_grad()
        self.optimizer.step()


def same_state(kept, replanned):
    for param, expected in zip(kept.all_params(), replanned.all_params()):
        assert torch.equal(param, expected)
        state, expected_state = kept.optimizer.state.get(param, {}), replanned.optimizer.state.get(expected, {})
        assert state.keys() == expected_state.keys()
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(expected_state[key])), key


def grad_lost_and_regained(run):
    run.step(without_grad=(0, 1))
    run.step()


def group_added(run):
    run.optimizer.add_param_group({"params": [run.spare]})
    run.step()


def group_params_appended(run):
    run.optimizer.param_groups[0]["params"].append(run.spare)
    run.step()


def state_loaded(run):
    saved = copy.deepcopy(run.optimizer.state_dict())
    for state in saved["state"].values():  # another state than the one stepped: the kept lists must not read it
        for key, value in state.items():
            if torch.is_tensor(value) and value.is_floating_point():
                state[key] = value * 0.5
    run.optimizer.load_state_dict(saved)
    run.step()


def state_cleared(run):
    run.optimizer.state.clear()
    run.step()


def state_replaced(run):
    run.optimizer.state = defaultdict(dict)
    run.step()


CHANGES = [grad_lost_and_regained, group_added, group_params_appended, state_loaded, state_cleared, state_replaced]


@pytest.mark.parametrize("change", CHANGES, ids=lambda change: change.__name__)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_kept_plan_steps_as_one_made_afresh_every_step_through_every_change(name, change):
    kept, replanned = Run(name, replan=False), Run(name, replan=True)
    for run in (kept, replanned):
        run.step()
        run.step()
        change(run)
        run.step()
    same_state(kept, replanned)


@pytest.mark.parametrize("name, key, value", [("MARS", "optimize_1d", True), ("MARS", "mars_type", "mars-shampoo"),
                                              ("MarsM", "matrix_rule", False), ("Moonlight", "matrix_rule", False)])
def test_a_hyperparameter_that_chooses_the_rule_resorts_the_group(name, key, value):
    kept, replanned = Run(name, replan=False), Run(name, replan=True)
    for run in (kept, replanned):
        run.step()
        run.optimizer.param_groups[0][key] = value
        run.step()
    same_state(kept, replanned)
    rules = {tuple(param.shape): rule for rule, params in kept.optimizer._group_plans[0].by_rule.items()
             for param in params}
    assert rules == {tuple(p.shape): kept.optimizer._rule(p, kept.optimizer.param_groups[0]) for p in kept.params}


def test_a_tensor_moved_to_another_dtype_is_stepped_by_the_backend_of_its_new_dtype():
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in SHAPES]
    optimizer = MARS(params, lr=0.01, backend="torch")
    for param in params:
        param.grad = torch.randn(param.shape)
    optimizer.step()
    params[0].data = params[0].data.double()  # the same tensor: a float64 batch of its own from now on
    params[0].grad = params[0].grad.double()
    optimizer.step()
    batches = optimizer._by_backend(optimizer._group_plans[0].by_rule["backend_mars"])
    assert [[param.dtype for param in batch] for _, batch in batches] == [[torch.float64], [torch.float32] * 2]


class CountingState(defaultdict):
    """The optimizer's state, counting lookups of a tensor's state."""

    lookups = 0

    def __getitem__(self, param):
        CountingState.lookups += 1
        return super().__getitem__(param)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_after_the_first_step_a_step_sorts_no_tensor_and_looks_up_no_state(name, monkeypatch):
    run = Run(name, replan=False)
    run.step()
    run.optimizer.state = CountingState(dict, run.optimizer.state)
    sorted_tensors = []
    rule = type(run.optimizer)._rule
    monkeypatch.setattr(type(run.optimizer), "_rule",
                        lambda self, param, group: (sorted_tensors.append(param), rule(self, param, group))[1])

    def counted_step():
        """The tensors sorted by rule and the state lookups of one ``step()`` (the exact scheme's stash, which
        looks up the state of the tensors it stashes, before it)."""
        for param in run.params:
            param.grad = torch.randn(param.shape)
        if getattr(run.optimizer, "needs_lookahead_grad", False):
            run.optimizer.stash_lookahead_grad()
        sorted_tensors.clear()
        CountingState.lookups = 0
        run.optimizer.step()
        return len(sorted_tensors), CountingState.lookups

    sorted_count, lookups = counted_step()  # the state was replaced: planned again
    assert sorted_count == len(SHAPES) and lookups >= len(SHAPES)
    assert counted_step() == (0, 0)
    assert counted_step() == (0, 0)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_a_sparse_gradient_after_kept_steps_is_still_refused_before_any_tensor_steps(name):
    run = Run(name, replan=False)
    run.step()
    before = [param.detach().clone() for param in run.params]
    for param in run.params:
        param.grad = torch.randn(param.shape)
    run.params[-1].grad = torch.randn(run.params[-1].shape).to_sparse()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        if getattr(run.optimizer, "needs_lookahead_grad", False):
            run.optimizer.stash_lookahead_grad()
        run.optimizer.step()
    assert all(torch.equal(param, expected) for param, expected in zip(run.params, before))
