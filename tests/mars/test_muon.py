"""mars.Muon: hand-checked steps, the MARS authors' Muon and AdamW bit for bit, AdamW for tensors that are not
2-D, state_dict round trips, validation."""
import copy
import io
import math

import pytest
import torch

from mars import Muon, muon_foreach, reference
from mars.newton_schulz import assign_owners, newton_schulz_cost
from tests.mars.test_mars_m import assert_same_params_and_state, count_calls
from tests.mars.test_newton_schulz import run_on_simulated_ranks
from tests.mars.test_process_group import start_group  # noqa: F401

# torch's AdamW and float32 updates: the options whose steps the hand-written float32 checks below follow.
TORCH_FLOAT32 = dict(adamw_variant="torch", update_dtype=torch.float32)


def test_two_nesterov_steps_match_the_update_written_out():
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(6, 4))
    grad1, grad2 = torch.randn(6, 4), torch.randn(6, 4)
    lr, momentum, weight_decay = 0.02, 0.95, 0.1
    optimizer = Muon([param], lr=lr, momentum=momentum, weight_decay=weight_decay, **TORCH_FLOAT32)
    expected = param.detach().clone()
    buffer = torch.zeros(6, 4)
    shape_scale = (6 / 4) ** 0.5
    for grad in (grad1, grad2):
        param.grad = grad.clone()
        optimizer.step()
        buffer = momentum * buffer + grad
        update = reference.newton_schulz5(grad + momentum * buffer) * shape_scale
        expected = expected * (1 - lr * weight_decay) - lr * update
    torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(optimizer.state[param]["momentum_buffer"], buffer, rtol=1e-6, atol=1e-7)


def test_ns_dtype_float32_orthogonalises_in_float32():
    torch.manual_seed(2)
    param = torch.nn.Parameter(torch.randn(5, 7))
    grad = torch.randn(5, 7)
    expected = param.detach() - 0.02 * reference.newton_schulz5(grad, dtype=torch.float32)
    param.grad = grad
    Muon([param], lr=0.02, nesterov=False, ns_dtype=torch.float32, **TORCH_FLOAT32).step()
    torch.testing.assert_close(param.detach(), expected, rtol=0, atol=0)


def test_same_shaped_matrices_stepped_together_match_one_optimizer_each():
    torch.manual_seed(3)
    shapes = [(8, 4), (8, 4), (4, 8), (8, 4), (6, 6)]
    together = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    alone = [torch.nn.Parameter(p.detach().clone()) for p in together]
    # float32 updates: batching moves float32 roundings, which a bfloat16 rounding could turn into bfloat16 steps.
    options = dict(lr=0.02, weight_decay=0.1, ns_dtype=torch.float32, update_dtype=torch.float32)
    batched = Muon(together, **options)
    singles = [Muon([p], **options) for p in alone]
    for _ in range(3):
        grads = [torch.randn(shape) for shape in shapes]
        for p, q, grad in zip(together, alone, grads):
            p.grad, q.grad = grad.clone(), grad.clone()
        batched.step()
        for single in singles:
            single.step()
    for p, q in zip(together, alone):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


def test_owners_balance_newton_schulz_work_and_the_largest_matrix_gets_a_rank_alone():
    shapes = [torch.Size(s) for s in [(768, 768)] * 12 + [(50304, 768)] + [(3072, 768)] * 12]
    owners = assign_owners(shapes, world_size=4)
    loads = [sum(newton_schulz_cost(s) for s, o in zip(shapes, owners) if o == rank) for rank in range(4)]
    embedding_owner = owners[12]
    assert [o for o in owners if o == embedding_owner] == [embedding_owner]  # the embedding's rank does no more
    assert max(loads) == loads[embedding_owner]  # nothing can be better than the largest single matrix
    others = [load for rank, load in enumerate(loads) if rank != embedding_owner]
    assert max(others) - min(others) <= newton_schulz_cost(torch.Size((3072, 768)))
    assert assign_owners(shapes, world_size=1) == [0] * len(shapes)


def test_without_nesterov_the_momentum_buffer_is_orthogonalised():
    torch.manual_seed(1)
    param = torch.nn.Parameter(torch.randn(3, 8))
    grad1, grad2 = torch.randn(3, 8), torch.randn(3, 8)
    optimizer = Muon([param], lr=0.05, momentum=0.9, nesterov=False, **TORCH_FLOAT32)
    expected = param.detach().clone()
    for grad in (grad1, grad2):
        param.grad = grad.clone()
        optimizer.step()
    buffer2 = 0.9 * grad1 + grad2
    # A wide matrix has rows / cols < 1, so no shape scale.
    expected = expected - 0.05 * reference.newton_schulz5(grad1) - 0.05 * reference.newton_schulz5(buffer2)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=1e-6)


def test_tensors_that_are_not_2d_take_torch_adamw_at_the_adamw_lr():
    # Step 1 of torch's AdamW is p - lr * (g / (|g| + eps) + wd * p), with lr = the group's adamw_lr.
    param = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    grad = torch.tensor([0.3, -0.02, 0.001])
    optimizer = Muon([param], lr=0.02, adamw_lr=0.004, adamw_weight_decay=0.1, adamw_eps=1e-8, adamw_variant="torch")
    optimizer.param_groups[0]["lr"] = 0.01  # a schedule halves lr: adamw_lr follows, to 0.002
    param.grad = grad
    p0 = param.detach().double().clone()
    optimizer.step()
    expected = p0 - 0.002 * (grad.double() / (grad.double().abs() + 1e-8) + 0.1 * p0)
    torch.testing.assert_close(param.detach().double(), expected, rtol=1e-6, atol=1e-8)


def authors_adamw(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    """One step of the MARS authors' AdamW (AGI-Arena/MARS MARS/optimizers/adamw.py), from its formula:
    p - lr sqrt(1 - beta2^t) / (1 - beta1^t) (wd p + m / (sqrt(v) + eps)). Returns the new (p, m, v).

    The moments take torch's scaled add, rounded once as the in-place ops of their code are, so that float32
    results can be compared bit for bit.
    """
    exp_avg = torch.add(beta1 * exp_avg, grad, alpha=1 - beta1)
    exp_avg_sq = torch.addcmul(beta2 * exp_avg_sq, grad, grad, value=1 - beta2)
    step_size = lr * math.sqrt(1 - beta2**step) / (1 - beta1**step)
    return param - step_size * (weight_decay * param + exp_avg / (exp_avg_sq.sqrt() + eps)), exp_avg, exp_avg_sq


def authors_newton_schulz(matrix, steps=5, eps=1e-7):
    """Their Muon's Newton-Schulz (MARS/optimizers/muon.py:14-36), eager: normalised and iterated in bfloat16."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = matrix.bfloat16()
    x = x / (x.norm() + eps)  # the bfloat16 copy's own norm, in bfloat16
    tall = matrix.size(0) > matrix.size(1)
    if tall:
        x = x.T
    for _ in range(steps):
        gram = x @ x.T
        gram_x = gram @ x
        x = a * x + b * gram_x + (c * gram) @ gram_x  # their `c * A @ B` reads as (c * A) @ B
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_authors_adamw_step_is_their_formula_bit_for_bit(shape):
    torch.manual_seed(11)
    lr, beta1, beta2, eps, weight_decay = 3e-3, 0.9, 0.95, 1e-8, 0.1
    param, exp_avg, exp_avg_sq = torch.randn(shape), torch.zeros(shape), torch.zeros(shape)
    expected, expected_m, expected_v = param.clone(), torch.zeros(shape), torch.zeros(shape)
    for step in range(1, 25):
        grad = torch.randn(shape) * 10.0 ** -(step % 4 * 3)  # down to 1e-9, where eps dominates sqrt(v)
        reference.authors_adamw_step(param, grad, exp_avg, exp_avg_sq, step=step, lr=lr, beta1=beta1, beta2=beta2,
                                     eps=eps, weight_decay=weight_decay)
        expected, expected_m, expected_v = authors_adamw(expected, grad, expected_m, expected_v, step, lr, beta1,
                                                         beta2, eps, weight_decay)
    torch.testing.assert_close(exp_avg, expected_m, rtol=0, atol=0)
    torch.testing.assert_close(exp_avg_sq, expected_v, rtol=0, atol=0)
    torch.testing.assert_close(param, expected, rtol=0, atol=0)


def test_tensors_that_are_not_2d_take_the_authors_adamw_by_default():
    # Step 1: p - lr sqrt(1 - b2) / (1 - b1) (wd p + (1 - b1) g / (sqrt(1 - b2) |g| + eps)): the weight decay
    # 2.2x torch's, and eps weighing on the 1e-8 gradient, where torch's would step by lr / 2.
    param = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    grad = torch.tensor([0.3, -0.02, 1e-8])
    optimizer = Muon([param], lr=0.02, adamw_lr=0.004, adamw_weight_decay=0.1, adamw_eps=1e-8)
    optimizer.param_groups[0]["lr"] = 0.01  # a schedule halves lr: adamw_lr follows, to 0.002
    param.grad = grad
    p0, g = param.detach().double().clone(), grad.double()
    optimizer.step()
    step_size = 0.002 * math.sqrt(1 - 0.95) / (1 - 0.9)
    expected = p0 - step_size * (0.1 * p0 + (1 - 0.9) * g / (math.sqrt(1 - 0.95) * g.abs() + 1e-8))
    torch.testing.assert_close(param.detach().double(), expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("nesterov", [True, False])
def test_default_muon_steps_bit_for_bit_as_the_authors_muon_and_adamw(nesterov):
    # Their CombinedOptimizer (MARS/opt.py) gives the 2-D tensors to their Muon and the rest to their AdamW,
    # each with its own lr (MARS/train_muon.py:216-217).
    torch.manual_seed(12)
    shapes = [(12, 4), (12, 4), (4, 12), (8, 8), (9,), (4,)]
    lr, momentum, weight_decay = 0.02, 0.95, 0.05
    adamw_lr, betas, eps, adamw_weight_decay = 3e-3, (0.9, 0.95), 1e-8, 0.1
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    optimizer = Muon(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                     adamw_lr=adamw_lr, adamw_betas=betas, adamw_eps=eps, adamw_weight_decay=adamw_weight_decay)
    theirs = [p.detach().clone() for p in params]
    state = [(torch.zeros(shape),) if len(shape) == 2 else (torch.zeros(shape), torch.zeros(shape))
             for shape in shapes]
    for step in range(1, 13):
        grads = [torch.randn(shape) for shape in shapes]
        for param, grad in zip(params, grads):
            param.grad = grad.clone()
        optimizer.step()
        for i, grad in enumerate(grads):
            if grad.dim() != 2:
                theirs[i], *state[i] = authors_adamw(theirs[i], grad, *state[i], step, adamw_lr, *betas, eps,
                                                     adamw_weight_decay)
                continue
            buffer = momentum * state[i][0] + grad
            state[i] = (buffer,)
            # d = g + mu b as their g.add(buf, alpha=momentum): one rounding.
            direction = torch.add(grad, buffer, alpha=momentum) if nesterov else buffer
            rows, cols = grad.shape
            update = authors_newton_schulz(direction) * max(1, rows / cols) ** 0.5  # in bfloat16, as their buffer
            theirs[i] = torch.add(theirs[i] * (1 - lr * weight_decay), update.float(), alpha=-lr)
    for param, their_param in zip(params, theirs):
        torch.testing.assert_close(param.detach(), their_param, rtol=0, atol=0)


@pytest.mark.parametrize("ns_form", ["gram", "fused_gram"])
def test_ns_form_orders_the_products_of_the_same_polynomial(ns_form):
    # In float32 every order lands on the same update (to rounding); in bfloat16 the order is visible.
    torch.manual_seed(14)
    shapes, grads = [(16, 8), (8, 24), (6,)], {}
    steps = {}
    for form in ("products", ns_form):
        for ns_dtype in (torch.float32, torch.bfloat16):
            params = [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]
            for param in params:
                param.grad = grads.setdefault(param.shape, torch.randn(param.shape)).clone()
            Muon(params, lr=1.0, ns_dtype=ns_dtype, ns_form=form).step()
            steps[form, ns_dtype] = [param.detach().clone() for param in params]
    for ours, authors in zip(steps[ns_form, torch.float32], steps["products", torch.float32]):
        torch.testing.assert_close(ours, authors, rtol=2**-7, atol=1e-6)  # the bfloat16 update rounding
    assert torch.equal(steps[ns_form, torch.bfloat16][2], steps["products", torch.bfloat16][2])  # AdamW's
    assert not torch.equal(steps[ns_form, torch.bfloat16][0], steps["products", torch.bfloat16][0])


def test_bfloat16_updates_are_the_float32_ones_rounded_to_bfloat16():
    # From zero with lr 1, the parameter becomes minus the update: NS(g) sqrt(16 / 8).
    torch.manual_seed(13)
    grad = torch.randn(16, 8)
    steps = {}
    for update_dtype in (torch.bfloat16, torch.float32):
        param = torch.nn.Parameter(torch.zeros(16, 8))
        param.grad = grad.clone()
        Muon([param], lr=1.0, ns_dtype=torch.float32, update_dtype=update_dtype).step()
        steps[update_dtype] = -param.detach()
    assert torch.equal(steps[torch.bfloat16], steps[torch.bfloat16].bfloat16().float())
    assert not torch.equal(steps[torch.float32], steps[torch.float32].bfloat16().float())
    # Two roundings (of NS(g), then of its scaled copy), each within bfloat16's relative 2^-8.
    torch.testing.assert_close(steps[torch.bfloat16], steps[torch.float32], rtol=2**-7, atol=0)


def test_muon_reduces_the_loss_of_a_small_regression():
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    inputs = torch.randn(64, 8)
    targets = inputs @ torch.randn(8, 1)
    optimizer = Muon(model.parameters(), lr=0.02)

    def loss():
        return torch.nn.functional.mse_loss(model(inputs), targets)

    initial = loss().item()
    for _ in range(50):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    assert loss().item() < 0.5 * initial


def test_bfloat16_params_keep_float32_state_through_a_state_dict_round_trip():
    torch.manual_seed(3)
    shapes = [(5, 3), (4,)]
    params = [torch.nn.Parameter(torch.randn(s).bfloat16()) for s in shapes]
    optimizer = Muon(params, lr=0.02, weight_decay=0.01)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape).bfloat16()
        optimizer.step()

    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = Muon(resumed_params, lr=0.02, weight_decay=0.01)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    for state in resumed.state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if torch.is_tensor(v))

    grads = [torch.randn(p.shape).bfloat16() for p in params]
    for opt, ps in ((optimizer, params), (resumed, resumed_params)):
        for p, g in zip(ps, grads):
            p.grad = g.clone()
        opt.step()
    for a, b in zip(params, resumed_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(lr=-1e-3), "lr"),
        (dict(momentum=1.0), "momentum"),
        (dict(momentum=-0.1), "momentum"),
        (dict(ns_steps=0), "ns_steps"),
        (dict(ns_steps=2.5), "ns_steps"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(adamw_lr=-1e-3), "adamw_lr"),
        (dict(adamw_betas=(0.9, 1.0)), "adamw_betas"),
        (dict(adamw_eps=-1e-8), "adamw_eps"),
        (dict(adamw_weight_decay=-0.1), "adamw_weight_decay"),
        (dict(ns_dtype=torch.float16), "ns_dtype"),
        (dict(adamw_variant="official"), "adamw_variant"),
        (dict(update_dtype=torch.float16), "update_dtype"),
        (dict(update_dtype="bfloat16"), "update_dtype"),
        (dict(ns_form="fused"), "ns_form"),
        (dict(ns_form="gram", update_dtype=torch.float32), "ns_form='gram'"),
        (dict(foreach=1), "foreach"),
        (dict(ns_cuda_graph=None), "ns_cuda_graph"),
    ],
)
def test_invalid_argument_raises_value_error_naming_it(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_complex_params_are_rejected():
    with pytest.raises(ValueError, match="complex"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.complex64))])


# The foreach path (mars.muon_foreach) against the per-tensor path (PER_TENSOR), which the tests above pin to the
# authors' code: the same operations in the same order, so on the CPU the same bits.
FOREACH_SHAPES = [(12, 4), (12, 4), (4, 12), (8, 8), (16, 4), (9,), (4,), (2, 3, 2)]  # three shape scales; a 3-D


def run_muon(initial, grads_per_step, **options):
    params = [torch.nn.Parameter(p.clone()) for p in initial]
    optimizer = Muon(params, lr=0.02, weight_decay=0.05, **options)
    for step, grads in enumerate(grads_per_step):
        idle = {4, 6} if step % 3 == 2 else set()  # a matrix and a vector without gradients: skipped, so their
        for index, (param, grad) in enumerate(zip(params, grads)):  # AdamW steps fall behind the others'
            param.grad = None if index in idle else grad.clone()
        for group in optimizer.param_groups:
            group["lr"] = 0.02 / (1 + step)  # a schedule
        optimizer.step()
    return optimizer, params


def random_grads(shapes, steps, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    initial = [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]
    grads = [[(torch.randn(shape, generator=generator) * 10.0 ** -(step % 3)).to(dtype) for shape in shapes]
             for step in range(steps)]
    return initial, grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", [
    dict(),  # the authors': bfloat16 updates, their AdamW, Nesterov
    dict(nesterov=False),
    dict(update_dtype=torch.float32, ns_form="fused_gram"),
    dict(adamw_variant="torch"),
], ids=["authors", "no-nesterov", "float32-updates", "torch-adamw"])
def test_foreach_steps_bit_for_bit_as_the_per_tensor_path(dtype, options):
    initial, grads = random_grads(FOREACH_SHAPES, 7, dtype, seed=30)
    per_tensor, per_tensor_params = run_muon(initial, grads, ns_dtype=torch.float32, foreach=False, **options)
    foreach, foreach_params = run_muon(initial, grads, ns_dtype=torch.float32, **options)
    assert foreach.foreach is None  # the default takes foreach ops
    assert_same_params_and_state(foreach, foreach_params, per_tensor, per_tensor_params)
    moved = [not torch.equal(p.detach(), q) for p, q in zip(foreach_params, initial)]
    assert all(moved)  # every tensor took steps: nothing compared equal by standing still


@pytest.mark.parametrize("foreach, path_taken", [(True, True), (False, False), (None, True)])
def test_foreach_option_chooses_the_path(foreach, path_taken, monkeypatch):
    calls = count_calls(monkeypatch, muon_foreach, ("muon_directions", "apply_muon_updates", "authors_adamw_steps"))
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    optimizer = Muon(params, ns_dtype=torch.float32, foreach=foreach)
    for param in params:
        param.grad = torch.randn(param.shape)
    optimizer.step()
    assert len(calls) == (3 if path_taken else 0)


@pytest.mark.parametrize("saved_by_foreach", [False, None])
def test_a_state_dict_saved_by_either_path_resumes_on_the_other_identically(saved_by_foreach):
    initial, grads = random_grads(FOREACH_SHAPES, 6, torch.float32, seed=31)
    optimizer, params = run_muon(initial, grads[:3], ns_dtype=torch.float32, foreach=saved_by_foreach)
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = Muon(resumed_params, lr=0.02, weight_decay=0.05, ns_dtype=torch.float32,
                   foreach=False if saved_by_foreach is None else None)
    resumed.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    for step_grads in grads[3:]:
        for opt, opt_params in ((optimizer, params), (resumed, resumed_params)):
            for param, grad in zip(opt_params, step_grads):
                param.grad = grad.clone()
            opt.step()
    assert_same_params_and_state(optimizer, params, resumed, resumed_params)


def test_a_sparse_gradient_is_refused_before_any_tensor_steps():
    matrix, vector = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))
    optimizer = Muon([vector, matrix])
    vector.grad, matrix.grad = torch.randn(3), torch.randn(4, 3).to_sparse()
    before = vector.detach().clone()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer.step()
    assert torch.equal(vector.detach(), before) and not optimizer.state


@pytest.mark.parametrize("foreach", [None, False])
def test_two_ranks_sharing_newton_schulz_step_bit_for_bit_as_one_process(monkeypatch, start_group, foreach):
    # Each rank orthogonalises its share; the all-reduced bfloat16 buffer hands both every update, which the
    # foreach path then scales in place (views of that buffer). One step: the simulation has one all-reduce a run.
    initial, grads = random_grads(FOREACH_SHAPES, 1, torch.float32, seed=32)

    def run(process_group):
        params = [torch.nn.Parameter(p.clone()) for p in initial]
        optimizer = Muon(params, lr=0.02, weight_decay=0.05, ns_dtype=torch.float32, foreach=foreach,
                         process_group=process_group)
        for step_grads in grads:
            for param, grad in zip(params, step_grads):
                param.grad = grad.clone()
            optimizer.step()
        return [p.detach() for p in params]

    alone = run(None)
    group = start_group()  # a real group (the optimizer holds it weakly); its collectives are simulated below
    ranks, buffers = run_on_simulated_ranks(monkeypatch, 2, lambda: run(group))
    assert all(buffer.dtype == torch.bfloat16 and buffer.count_nonzero() > 0 for buffer in buffers)
    for params in ranks:
        for param, expected in zip(params, alone):
            assert torch.equal(param, expected)
