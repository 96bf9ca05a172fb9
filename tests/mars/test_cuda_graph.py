"""mars.cuda_graph: Newton-Schulz captured once and replayed gives what the eager path gives, step after step.

A CUDA graph needs a GPU. On the CPU, :class:`ReplayedEagerly` keeps everything of
:class:`mars.cuda_graph.CapturedLists` but the graph itself: its "replay" reruns the captured function on the
static inputs and writes the results into the captured output tensors, which is what a replay does. That checks the
buffer handling (fresh inputs copied in, outputs reused, a new capture when and only when something changed) and
the optimizers' wiring; the tests marked ``cuda`` check the real graph where a GPU is present.
"""
import copy
import pickle

import pytest
import torch

from mars import MARS, MarsM, Muon, cuda_graph
from mars.cuda_graph import CapturedLists
from mars.newton_schulz import orthogonalise
from tests.mars.newton_schulz_cases import forms, newton_schulz_optimizers
from tests.mars.test_newton_schulz import SHAPES, orthogonalise_on_ranks

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


class ReplayedEagerly(CapturedLists):
    """CapturedLists with the CUDA graph replaced by rerunning the captured function into the captured outputs."""

    @staticmethod
    def check_devices(tensors):
        pass  # the CPU stands in for the GPU here

    def _capture(self, fn, static_inputs):
        return fn(static_inputs)

    def _replay(self):
        for output, fresh in zip(self._outputs, self._fn(self._static_inputs)):
            output.copy_(fresh)


def random_matrices(seed, shapes=SHAPES):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in shapes]


@pytest.mark.parametrize("form", ["products", "gram", "fused_gram"])
@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_each_call_reads_its_own_inputs_into_the_same_outputs(form, batch, out_dtype):
    graph = ReplayedEagerly()
    options = dict(dtype=torch.bfloat16, norm_in_dtype=True, out_dtype=out_dtype, form=form, batch=batch)
    addresses = None
    for seed in range(3):
        matrices = random_matrices(seed)
        results = orthogonalise(matrices, graph=graph, **options)
        for result, expected in zip(results, orthogonalise(matrices, **options)):
            assert torch.equal(result, expected)
        # The outputs are the graph's buffers: the same memory every call, overwritten by the next one.
        assert addresses in (None, [result.data_ptr() for result in results])
        addresses = [result.data_ptr() for result in results]
    assert graph.captures == 1
    # Normalised by the bfloat16 copy's own norm, the matrices are held as that copy: half float32's memory.
    assert {static.dtype for static in graph._static_inputs} == {torch.bfloat16}


def test_matrices_normalised_by_their_float32_norm_are_held_in_float32():
    graph = ReplayedEagerly()
    matrices = random_matrices(0)
    options = dict(dtype=torch.bfloat16, norm_in_dtype=False, out_dtype=torch.float32)
    for result, expected in zip(orthogonalise(matrices, graph=graph, **options), orthogonalise(matrices, **options)):
        assert torch.equal(result, expected)
    assert {static.dtype for static in graph._static_inputs} == {torch.float32}


def test_a_new_capture_exactly_when_the_inputs_layout_or_the_options_change():
    graph = ReplayedEagerly()
    matrices = random_matrices(0)
    calls = [
        (matrices, dict(form="products"), 1),
        (random_matrices(1), dict(form="products"), 1),  # new values only: replayed
        (matrices[:-1], dict(form="products"), 2),  # one matrix fewer
        (matrices[:-1], dict(form="fused_gram"), 3),  # another form
        (matrices[:-1], dict(form="fused_gram", steps=4), 4),
        ([m.double() for m in matrices[:-1]], dict(form="fused_gram", steps=4), 5),  # another dtype
        # Transposed layouts: the products may round otherwise, so the eager results need a graph of their own.
        ([m.double().t().contiguous().t() for m in matrices[:-1]], dict(form="fused_gram", steps=4), 6),
        ([m.double().t().contiguous().t() for m in matrices[:-1]], dict(form="fused_gram", steps=4), 6),
    ]
    for inputs, options, captures in calls:
        options = dict(dtype=torch.float32, **options)
        results = orthogonalise(inputs, graph=graph, **options)
        assert graph.captures == captures
        for result, expected in zip(results, orthogonalise(inputs, **options)):
            assert torch.equal(result, expected)


def test_ranks_sharing_the_work_through_a_graph_return_what_one_process_does(monkeypatch):
    matrices = random_matrices(0)
    options = dict(dtype=torch.bfloat16, norm_in_dtype=True, out_dtype=torch.bfloat16)
    alone = orthogonalise(matrices, **options)
    ranks, _ = orthogonalise_on_ranks(monkeypatch, matrices, 3, graph=ReplayedEagerly(), **options)
    for results in ranks:
        for result, expected in zip(results, alone):
            assert torch.equal(result, expected)


def test_a_failed_capture_says_how_to_turn_the_graph_off_and_leaves_nothing_captured():
    class FailingCapture(ReplayedEagerly):
        def _capture(self, fn, static_inputs):
            raise RuntimeError("operation not permitted when stream is capturing")

    graph = FailingCapture()
    with pytest.raises(RuntimeError, match="not permitted .*; set optimizer.ns_cuda_graph=false"):
        orthogonalise(random_matrices(0), graph=graph)
    assert graph.signature is None and graph.captures == 0 and not graph._static_inputs


def test_a_capture_refuses_cpu_tensors_and_says_how_to_turn_it_off():
    with pytest.raises(ValueError, match="ns_cuda_graph=false"):
        orthogonalise(random_matrices(0), graph=CapturedLists())


def two_groups():
    """Parameters of two param groups: matrices and a vector in each, so that each group orthogonalises."""
    generator = torch.Generator().manual_seed(7)
    shapes = [[(12, 4), (8, 8), (5,)], [(4, 12), (3, 5), (4,)]]
    return [[torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in group] for group in shapes]


def newton_schulz_optimizer(optimizer_class, arguments):
    """The optimizer over ``groups`` (one param group each), Newton-Schulz in float32."""
    return lambda groups, **options: optimizer_class([{"params": g} for g in groups], **arguments,
                                                     ns_dtype=torch.float32, **options)


# Every optimizer of mars that runs Newton-Schulz in each form it takes (the exact scheme's stash aside).
OPTIMIZERS = {f"{name}-{form}": newton_schulz_optimizer(cls, {**arguments, "ns_form": form})
              for name, (cls, arguments) in newton_schulz_optimizers().items() if "is_approx" not in arguments
              for form in forms(cls, arguments)}


def run_steps(make_optimizer, steps=4, **options):
    groups = two_groups()
    optimizer = make_optimizer(groups, **options)
    generator = torch.Generator().manual_seed(11)
    for _ in range(steps):
        for param in (p for group in groups for p in group):
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()
    return optimizer, [p.detach().clone() for group in groups for p in group]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_optimizers_with_ns_cuda_graph_step_as_without_it(monkeypatch, name):
    monkeypatch.setattr(cuda_graph, "CapturedLists", ReplayedEagerly)
    _, eager = run_steps(OPTIMIZERS[name])
    optimizer, graphed = run_steps(OPTIMIZERS[name], ns_cuda_graph=True)
    for param, expected in zip(graphed, eager):
        assert torch.equal(param, expected)
    # One graph per group, each captured once and replayed on the later steps.
    graphs = optimizer._newton_schulz_graphs
    assert sorted(graphs) == [0, 1] and [graph.captures for graph in graphs.values()] == [1, 1]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_ns_cuda_graph_with_cpu_parameters_is_refused_when_built_and_when_stepped(name):
    with pytest.raises(ValueError, match="one CUDA device, got \\['cpu'\\]: set optimizer.ns_cuda_graph=false"):
        OPTIMIZERS[name](two_groups(), ns_cuda_graph=True)
    # Parameters moved off the GPU after the optimizer was built: the capture refuses them.
    groups = two_groups()
    optimizer = OPTIMIZERS[name](groups)
    optimizer.ns_cuda_graph = True
    for param in (p for group in groups for p in group):
        param.grad = torch.ones_like(param)
    with pytest.raises(ValueError, match="ns_cuda_graph=false"):
        optimizer.step()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_option_survives_a_copy_and_a_pickle_and_the_graphs_do_not(monkeypatch, name):
    monkeypatch.setattr(cuda_graph, "CapturedLists", ReplayedEagerly)
    optimizer, _ = run_steps(OPTIMIZERS[name], steps=1, ns_cuda_graph=True)
    assert optimizer._newton_schulz_graphs  # captured: a CUDA graph cannot be copied or pickled
    for restored in (copy.deepcopy(optimizer), pickle.loads(pickle.dumps(optimizer))):
        assert restored.ns_cuda_graph is True and "_newton_schulz_graphs" not in restored.__dict__


@pytest.mark.parametrize("make", [
    lambda: Muon([torch.nn.Parameter(torch.ones(2, 2))], ns_cuda_graph=1),
    lambda: MarsM([torch.nn.Parameter(torch.ones(2, 2))], ns_cuda_graph="yes"),
    lambda: MARS([torch.nn.Parameter(torch.ones(2, 2))], ns_cuda_graph=None),
])
def test_ns_cuda_graph_must_be_a_bool(make):
    with pytest.raises(ValueError, match="ns_cuda_graph must be True or False"):
        make()


def test_the_reference_backend_has_no_graph_to_capture():
    with pytest.raises(ValueError, match="backend='reference'"):
        MARS([torch.nn.Parameter(torch.ones(2, 2))], mars_type="mars-shampoo", backend="reference",
             ns_cuda_graph=True)


@needs_cuda
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_on_cuda_the_graph_steps_bit_for_bit_as_the_eager_kernels(name):
    def on_cuda(make):
        def make_on_cuda(groups, **options):
            for group in groups:
                for param in group:
                    param.data = param.data.cuda()
            return make(groups, **options)
        return make_on_cuda

    groups_eager, groups_graphed = two_groups(), two_groups()
    optimizers = [on_cuda(OPTIMIZERS[name])(groups_eager),
                  on_cuda(OPTIMIZERS[name])(groups_graphed, ns_cuda_graph=True)]
    generator = torch.Generator().manual_seed(11)
    for _ in range(4):
        for eager, graphed in zip((p for g in groups_eager for p in g), (p for g in groups_graphed for p in g)):
            grad = torch.randn(eager.shape, generator=generator).cuda()
            eager.grad, graphed.grad = grad, grad.clone()
        for optimizer in optimizers:
            optimizer.step()
    for eager, graphed in zip((p for g in groups_eager for p in g), (p for g in groups_graphed for p in g)):
        assert torch.equal(eager, graphed)
    assert [graph.captures for graph in optimizers[1]._newton_schulz_graphs.values()] == [1, 1]
