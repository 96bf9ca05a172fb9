"""The optimizers' ``ns_batch``: same-shaped matrices orthogonalised as one batch step bit for bit as one matrix at a
time on the CPU, for every optimizer that runs Newton-Schulz and every form it takes, alone, through the CUDA
graph's buffers, shared over ranks and under ZeRO-1 (real Gloo ranks), and across a state dict saved with the
other setting.

Bit for bit on the CPU because each matrix of a batch goes through the same per-matrix arithmetic: its own norm
(divided in float32 and rounded to the Newton-Schulz dtype, as a 0-dim norm is), and torch's CPU batched product
runs the 2-D product on each slice. On CUDA a batched product (another cuBLAS kernel) may round otherwise: not
checked here.
"""
import copy
import inspect
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from mars import MARS, MarsM, Moonlight, Muon, cuda_graph, newton_schulz
from tests import warm_python
from tests.mars.newton_schulz_cases import forms, newton_schulz_optimizers
from tests.mars.test_cuda_graph import ReplayedEagerly

REPO = Path(__file__).resolve().parents[2]

# Repeated shapes (three 12 x 4, two 4 x 12, two 8 x 8) beside single ones, and vectors for the AdamW part.
SHAPES = [(12, 4), (8, 8), (12, 4), (5,), (4, 12), (8, 8), (12, 4), (3, 5), (4, 12), (4,)]


# name -> the optimizer's class and arguments; every one runs Newton-Schulz in bfloat16, the dtype whose rounding a
# different division or product order would show.
OPTIMIZERS = newton_schulz_optimizers()


def make(name, params, **options):
    optimizer_class, arguments = OPTIMIZERS[name]
    return optimizer_class(params, **arguments, **options)


CASES = [(name, form) for name, case in OPTIMIZERS.items() for form in forms(*case)]


def initial_params(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def gradients(steps, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(shape, generator=generator) for shape in SHAPES] for _ in range(steps)]


def set_grads(params, grads):
    for param, grad in zip(params, grads):
        param.grad = grad.clone()


def step(optimizer, params, grads, lookahead_grads):
    """One step as a trainer takes it; the exact scheme stashes the look-ahead gradient first."""
    if getattr(optimizer, "needs_lookahead_grad", False):
        set_grads(params, lookahead_grads)
        optimizer.stash_lookahead_grad()
    set_grads(params, grads)
    optimizer.step()


def run(name, form, steps=3, zero1=False, **options):
    """The parameters after ``steps`` steps of the optimizer ``name`` with ``options`` (sharded by ZeRO-1 over the
    running Gloo group with ``zero1``), and the optimizer."""
    params = [torch.nn.Parameter(p) for p in initial_params()]
    if zero1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        optimizer_class, arguments = OPTIMIZERS[name]
        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, **arguments, ns_form=form,
                                            **options)
    else:
        optimizer = make(name, params, ns_form=form, **options)
    for grads, lookahead in zip(gradients(steps), gradients(steps, seed=2)):
        step(optimizer, params, grads, lookahead)
    return [p.detach().clone() for p in params], optimizer


@pytest.mark.parametrize("name, form", CASES)
def test_batched_newton_schulz_steps_bit_for_bit_as_one_matrix_at_a_time(name, form, monkeypatch):
    one_by_one, _ = run(name, form)
    stacked = []
    batched_newton_schulz = newton_schulz.newton_schulz5
    monkeypatch.setattr(newton_schulz, "newton_schulz5", lambda matrix, *args, **kwargs: (
        stacked.append(tuple(matrix.shape)), batched_newton_schulz(matrix, *args, **kwargs))[1])
    batched, optimizer = run(name, form, ns_batch=True)
    assert optimizer.ns_batch is True
    for param, expected in zip(batched, one_by_one):
        assert torch.equal(param, expected)
    # Each step: one batch per repeated shape, the single 3 x 5 alone.
    assert sorted(set(stacked)) == [(2, 4, 12), (2, 8, 8), (3, 5), (3, 12, 4)]


@pytest.mark.parametrize("name", ["Muon", "MARS", "MarsM"])
def test_batched_newton_schulz_through_the_graphs_buffers_steps_as_one_matrix_at_a_time(name, monkeypatch):
    monkeypatch.setattr(cuda_graph, "CapturedLists", ReplayedEagerly)  # the graph's buffers, replayed on the CPU
    one_by_one, _ = run(name, "products")
    graphed, optimizer = run(name, "products", ns_batch=True, ns_cuda_graph=True)
    for param, expected in zip(graphed, one_by_one):
        assert torch.equal(param, expected)
    assert [graph.captures for graph in optimizer._newton_schulz_graphs.values()] == [1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("name", ["Muon", "MARS", "MarsM"])
def test_on_cuda_the_batched_graph_steps_bit_for_bit_as_the_batched_eager_kernels(name):
    def on_cuda(**options):
        params = [torch.nn.Parameter(p.cuda()) for p in initial_params()]
        optimizer = make(name, params, ns_form="products", ns_batch=True, **options)
        for grads, lookahead in zip(gradients(3), gradients(3, seed=2)):
            step(optimizer, params, [g.cuda() for g in grads], [g.cuda() for g in lookahead])
        return params

    for graphed, eager in zip(on_cuda(ns_cuda_graph=True), on_cuda()):
        assert torch.equal(graphed, eager)


@pytest.mark.parametrize("name", ["Muon", "MARS-exact", "MarsM-exact", "Moonlight"])
@pytest.mark.parametrize("saved_batched", [False, True])
def test_a_state_dict_resumes_across_the_option_identically(name, saved_batched):
    form = inspect.signature(OPTIMIZERS[name][0]).parameters["ns_form"].default  # the authors' for each
    params = [torch.nn.Parameter(p) for p in initial_params()]
    saving = make(name, params, ns_form=form, ns_batch=saved_batched)
    grads, lookaheads = gradients(4), gradients(4, seed=2)
    for index in range(2):
        step(saving, params, grads[index], lookaheads[index])
    saved = copy.deepcopy(saving.state_dict())  # load_state_dict would share the saving one's buffers
    assert all("ns_batch" not in group for group in saved["param_groups"])  # an option of the optimizer, unsaved
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = make(name, resumed_params, ns_form=form, ns_batch=not saved_batched)
    resumed.load_state_dict(saved)
    assert resumed.ns_batch is (not saved_batched)
    for index in range(2, 4):
        step(saving, params, grads[index], lookaheads[index])
        step(resumed, resumed_params, grads[index], lookaheads[index])
    for param, expected in zip(resumed_params, params):
        assert torch.equal(param, expected)


@pytest.mark.parametrize("make", [
    lambda: Muon([torch.nn.Parameter(torch.ones(2, 2))], ns_batch=1),
    lambda: MarsM([torch.nn.Parameter(torch.ones(2, 2))], ns_batch="yes"),
    lambda: Moonlight([torch.nn.Parameter(torch.ones(2, 2))], ns_batch=None),
    lambda: MARS([torch.nn.Parameter(torch.ones(2, 2))], mars_type="mars-shampoo", ns_batch=0),
])
def test_ns_batch_must_be_a_bool(make):
    with pytest.raises(ValueError, match="ns_batch must be True or False"):
        make()


def test_the_reference_backend_runs_one_matrix_at_a_time_and_refuses_ns_batch():
    with pytest.raises(ValueError, match="ns_batch=True .* backend='reference' .* or ns_batch=False"):
        MARS([torch.nn.Parameter(torch.ones(2, 2))], mars_type="mars-shampoo", backend="reference", ns_batch=True)


def test_a_param_group_setting_ns_batch_otherwise_is_refused():
    optimizer = Muon([torch.nn.Parameter(torch.ones(2, 2))], ns_batch=True)
    with pytest.raises(ValueError, match="ns_batch is an option of the whole Muon"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(2, 2))], "ns_batch": False})


# ------------------------------------------------------------------------------------------- real Gloo ranks
# Each class in its default scheme.
RANK_OPTIMIZERS = [name for name, (cls, _) in OPTIMIZERS.items() if name == cls.__name__]


def steps_on_rank(out) -> None:
    """Run on each rank of a Gloo job (``python -m tests.mars.test_ns_batch OUT``, the ranks forked by
    ``warm_python.run_ranks``): every optimizer and form, its Newton-Schulz shared over the group (ZeRO-1 off) or
    its parameters sharded by ZeRO-1, one matrix at a time and batched: rank 0 saves the parameters after three
    steps, by (name, form, zero1, ns_batch), to ``out`` (ZeRO-1 broadcasts every rank's share to all)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        finals = {}
        for name in RANK_OPTIMIZERS:
            for form in forms(*OPTIMIZERS[name]):
                for ns_batch in (False, True):
                    finals[name, form, False, ns_batch], _ = run(name, form, ns_batch=ns_batch,
                                                                 process_group=dist.group.WORLD)
                    finals[name, form, True, ns_batch], _ = run(name, form, ns_batch=ns_batch, zero1=True)
        if dist.get_rank() == 0:
            torch.save(finals, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_gloo_ranks_batched_or_not_shared_or_zero1_step_as_one_process(world_size, tmp_path):
    ranks = warm_python.run_ranks([sys.executable, "-m", "tests.mars.test_ns_batch", tmp_path / "finals.pt"],
                                  world_size=world_size, cwd=REPO, timeout=600)
    for rank in ranks:
        assert rank.returncode == 0, rank.stderr
    results = torch.load(tmp_path / "finals.pt", weights_only=True)
    for name in RANK_OPTIMIZERS:
        for form in forms(*OPTIMIZERS[name]):
            alone, _ = run(name, form)
            for zero1 in (False, True):
                for ns_batch in (False, True):
                    for param, expected in zip(results[name, form, zero1, ns_batch], alone):
                        assert torch.equal(param, expected), (name, form, zero1, ns_batch)


if __name__ == "__main__":
    steps_on_rank(sys.argv[1])
