"""A compiled step of every optimizer of mars, with every path, against its eager step, as torch tests its own
optimizers (``test/inductor/test_compiled_optimizers.py``): ``torch.compile(optimizer.step)``, and a compiled
function holding forward, backward and step, the recipe of PyTorch's "compiling the optimizer" tutorial.

The default path of each class runs under dynamo with AOT autograd and no code generation (``aot_eager``), the
other paths under dynamo alone (``eager``): what tracing can get wrong (Python-side caches read as constants of a
graph, writes made at trace time only, state mutations) shows there, at a fraction of inductor's compile time;
inductor itself compiles the default paths, in the slow tier.
"""
import inspect

import pytest
import torch
import torch._dynamo

from mars import reference
from tests.mars.test_torch_conventions import OPTIMIZERS, clone_params, gradients, new_params

STEPS = 5
# A compiled step adds graphs at its first two steps (the state created; the state there, its step counts tensors
# incremented in place, mars.step_count) and none after: one graph each for a default path, more where a path
# breaks the graph. MARS's Triton backend steps its groups eagerly inside a
# compiled step (its launches read the tensors' data pointers): no graph of the update at all.
GRAPHS_OF_A_DEFAULT_PATH = 2


def compiled_paths(param) -> list:
    """``param`` (a conventions case: class, options) and the variants of it that step by other code, read from the
    class's arguments: the exact scheme, Newton-Schulz batched by shape, MARS on the 1-D tensors, each other MARS
    type."""
    cls, options = param.values
    arguments = inspect.signature(cls).parameters
    variants = [{}]
    if "is_approx" in arguments:
        variants.append(dict(is_approx=False))
    if "ns_batch" in arguments and options.get("backend") != "reference":
        variants.append(dict(ns_batch=True))
    if "optimize_1d" in arguments:
        variants.append(dict(optimize_1d=True))
    if "mars_type" in arguments and "mars_type" not in options:
        variants += [dict(mars_type=name) for name in reference.MARS_TYPES if name != "mars-adamw"]
    return [pytest.param(cls, {**options, **variant}, marks=param.marks,
                         id="-".join([param.id, *(f"{key}={value}" for key, value in variant.items())]))
            for variant in variants]


CASES = [path for param in OPTIMIZERS for path in compiled_paths(param)]


def feed_gradients(optimizer, param_lists, step):
    """Give every list of parameters the same gradients of ``step``; in the exact scheme first the look-ahead
    gradients (another step's), stashed eagerly as the optimizer's docstring loop does."""
    if getattr(optimizer[0], "needs_lookahead_grad", False):
        for params in param_lists:
            for param, grad in zip(params, gradients(params, step + 100)):
                param.grad = grad
        for each in optimizer:
            each.stash_lookahead_grad()
    for params in param_lists:
        for param, grad in zip(params, gradients(params, step)):
            param.grad = grad


def assert_same_state(actual, expected):
    """The same state entries; tensors within float32 rounding (assert_close's defaults), others equal; a step
    count the same number, a compiled step's a tensor (mars.step_count), an eager one's an int."""
    assert actual["state"].keys() == expected["state"].keys()
    for index, state in expected["state"].items():
        assert actual["state"][index].keys() == state.keys(), index
        for key, value in state.items():
            if key == "step":
                assert float(actual["state"][index][key]) == value, (index, key)
            elif torch.is_tensor(value):
                torch.testing.assert_close(actual["state"][index][key], value, msg=f"state {index} {key}")
            else:
                assert actual["state"][index][key] == value, (index, key)


def compiled_counting_graphs(step, options):
    """``step`` compiled afresh, and the list of the graphs it compiles: under ``aot_eager`` for a default path
    (``options`` empty), dynamo alone for the others."""
    torch._dynamo.reset()
    graphs = []

    def counting(graph_module, example_inputs):
        graphs.append(graph_module)
        return torch._dynamo.lookup_backend("aot_eager" if not options else "eager")(graph_module, example_inputs)

    return torch.compile(step, backend=counting), graphs


@pytest.mark.parametrize("cls, options", CASES)
def test_a_compiled_step_gives_the_eager_steps_parameters_and_state(cls, options):
    eager_params = new_params()
    compiled_params = clone_params(eager_params)
    eager, compiled = cls(eager_params, **options), cls(compiled_params, **options)
    step, graphs = compiled_counting_graphs(compiled.step, options)
    start = clone_params(eager_params)
    graphs_after = []
    for index in range(STEPS):
        feed_gradients((eager, compiled), (eager_params, compiled_params), index)
        eager.step()
        step()
        graphs_after.append(len(graphs))
        for number, (actual, expected) in enumerate(zip(compiled_params, eager_params)):
            torch.testing.assert_close(actual, expected, msg=f"parameter {number} after step {index + 1}")
        assert_same_state(compiled.state_dict(), eager.state_dict())
    # Every tensor moved (a compiled step that left the 1-D tensors alone once passed an eager one that did too).
    assert all(not torch.equal(before, after) for before, after in zip(start, compiled_params))
    assert graphs_after[1:] == [graphs_after[1]] * (STEPS - 1), graphs_after  # none after the second step
    if not options:
        assert graphs_after[1] == GRAPHS_OF_A_DEFAULT_PATH, graphs_after


class SmallModel(torch.nn.Module):
    """A matrix, a LayerNorm and biases: every rule of every optimizer steps something."""

    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(6, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.relu(self.norm(self.hidden(x))))


def train_iterations(optimizer, model, iterations, compile_backend=None):
    """``iterations`` of forward, backward and step on seeded batches, the whole iteration compiled with
    ``compile_backend`` (None: eager)."""
    def iteration(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    run = iteration if compile_backend is None else torch.compile(iteration, backend=compile_backend)
    generator = torch.Generator().manual_seed(0)
    return [run(torch.randn(4, 6, generator=generator), torch.randn(4, 3, generator=generator)).item()
            for _ in range(iterations)]


@pytest.mark.parametrize("cls, options", [case for case in OPTIMIZERS if not case.values[1]])
def test_a_compiled_forward_backward_and_step_trains_as_eagerly(cls, options):
    torch.manual_seed(0)
    eager_model = SmallModel()
    compiled_model = SmallModel()
    compiled_model.load_state_dict(eager_model.state_dict())
    eager, compiled = cls(eager_model.parameters()), cls(compiled_model.parameters())
    torch._dynamo.reset()
    eager_losses = train_iterations(eager, eager_model, 3)
    compiled_losses = train_iterations(compiled, compiled_model, 3, compile_backend="aot_eager")
    torch.testing.assert_close(compiled_losses, eager_losses)
    for name, tensor in eager_model.state_dict().items():
        torch.testing.assert_close(compiled_model.state_dict()[name], tensor, msg=name)
    assert_same_state(compiled.state_dict(), eager.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("cls, options", [case for case in OPTIMIZERS if not case.values[1]])
def test_an_inductor_compiled_step_gives_the_eager_steps_parameters(cls, options):
    # inductor generates and compiles C++ for the step: the default path of each optimizer, a few steps, with
    # Newton-Schulz and Muon's updates in float32. In bfloat16 the compiled step is not the eager one: inductor's
    # fused kernels round to bfloat16 once where eager rounds every op's result (a cast to bfloat16 and back is
    # fused away unless torch._inductor.config.emulate_precision_casts; docs/optimizers.md). A tensor lr, halved by a
    # scheduler between the steps: inductor's code computes the step sizes from it.
    arguments = inspect.signature(cls).parameters
    options = {**options, **{key: torch.float32 for key in ("ns_dtype", "update_dtype") if key in arguments}}
    eager_params = new_params()
    compiled_params = clone_params(eager_params)
    eager, compiled = (cls(params, **options, lr=torch.tensor(1e-2)) for params in (eager_params, compiled_params))
    schedulers = [torch.optim.lr_scheduler.LambdaLR(each, lambda step: 0.5**step) for each in (eager, compiled)]
    torch._dynamo.reset()
    step = torch.compile(compiled.step)
    for index in range(2):  # a step with fresh state, then one with state
        feed_gradients((eager, compiled), (eager_params, compiled_params), index)
        eager.step()
        step()
        for scheduler in schedulers:
            scheduler.step()
    for actual, expected in zip(compiled_params, eager_params):
        torch.testing.assert_close(actual, expected)
    assert_same_state(compiled.state_dict(), eager.state_dict())


@pytest.mark.parametrize("cls, options", [case for case in OPTIMIZERS if not case.values[1]])
def test_a_compiled_step_under_a_torch_scheduler_follows_the_eager_one(cls, options):
    # torch's schedulers write a new float lr into every group at every step. Under AOT autograd (and inductor)
    # the lr is specialised, a graph per value, as for torch's own AdamW (docs/optimizers.md): the numbers still
    # follow the eager step's.
    eager_params = new_params()
    compiled_params = clone_params(eager_params)
    eager, compiled = cls(eager_params), cls(compiled_params)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(each, lambda step: 1.0 / (1 + step)) for each in (eager, compiled)]
    torch._dynamo.reset()
    step = torch.compile(compiled.step, backend="aot_eager")
    for index in range(3):  # each a new lr, each compiled afresh
        feed_gradients((eager, compiled), (eager_params, compiled_params), index)
        eager.step()
        step()
        for scheduler in schedulers:
            scheduler.step()
        assert compiled.param_groups[0]["lr"] == eager.param_groups[0]["lr"]
        for actual, expected in zip(compiled_params, eager_params):
            torch.testing.assert_close(actual, expected)
        assert_same_state(compiled.state_dict(), eager.state_dict())


@pytest.mark.parametrize("cls, options", CASES)
def test_a_compiled_step_with_a_tensor_lr_under_a_torch_scheduler_compiles_no_graph_after_its_second_step(
        cls, options):
    # torch's recipe for a compiled step under a scheduler: lr=torch.tensor(...), which the scheduler fills in place
    # and the traced step keeps a tensor (mars.optimizer.step_lr). Every rate moves (MARS's lr_1d and Muon's adamw_lr
    # follow lr), the numbers follow the eager step's, and no lr is a constant of a graph.
    eager_params = new_params()
    compiled_params = clone_params(eager_params)
    eager, compiled = (cls(params, **options, lr=torch.tensor(1e-2)) for params in (eager_params, compiled_params))
    schedulers = [torch.optim.lr_scheduler.LambdaLR(each, lambda step: 1.0 / (1 + step)) for each in (eager, compiled)]
    step, graphs = compiled_counting_graphs(compiled.step, options)
    graphs_after = []
    for index in range(STEPS):
        feed_gradients((eager, compiled), (eager_params, compiled_params), index)
        eager.step()
        step()
        for scheduler in schedulers:
            scheduler.step()
        graphs_after.append(len(graphs))
        for number, (actual, expected) in enumerate(zip(compiled_params, eager_params)):
            torch.testing.assert_close(actual, expected, msg=f"parameter {number} after step {index + 1}")
        assert_same_state(compiled.state_dict(), eager.state_dict())
    assert torch.is_tensor(compiled.param_groups[0]["lr"])
    assert graphs_after[1:] == [graphs_after[1]] * (STEPS - 1), graphs_after  # none after the second step


@pytest.mark.parametrize("cls, options", [case for case in OPTIMIZERS if not case.values[1]])
def test_compiled_and_eager_steps_take_each_others_step_counts(cls, options):
    # A traced step counts in float32 tensors, an eager one in ints (mars.step_count). An eager step, three compiled
    # ones, a save and a load into a fresh optimizer, two eager steps: the eager run's numbers and counts throughout,
    # and the compiled steps from the eager state add no graph after their second.
    eager_params = new_params()
    mixed_params = clone_params(eager_params)
    eager, mixed = cls(eager_params, **options), cls(mixed_params, **options)
    step, graphs = compiled_counting_graphs(mixed.step, options)
    graphs_after = []
    for index in range(6):
        if index == 4:
            saved = mixed.state_dict()
            counts = [state["step"] for state in saved["state"].values() if "step" in state]
            assert counts and all(torch.is_tensor(count) and count.dtype == torch.float32 for count in counts)
            mixed = cls(mixed_params, **options)
            mixed.load_state_dict(saved)
        feed_gradients((eager, mixed), (eager_params, mixed_params), index)
        eager.step()
        if index in (1, 2, 3):
            step()
            graphs_after.append(len(graphs))
        else:
            mixed.step()
        for number, (actual, expected) in enumerate(zip(mixed_params, eager_params)):
            torch.testing.assert_close(actual, expected, msg=f"parameter {number} after step {index + 1}")
        assert_same_state(mixed.state_dict(), eager.state_dict())
    assert all(type(state["step"]) is int for state in mixed.state_dict()["state"].values() if "step" in state)
    assert graphs_after[1] == graphs_after[2], graphs_after
