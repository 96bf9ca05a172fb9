"""mars.Muon: hand-checked steps, AdamW for tensors that are not 2-D, state_dict round trip, validation."""
import io

import pytest
import torch

from mars import Muon, reference
from mars.newton_schulz import assign_owners, newton_schulz_cost


def test_two_nesterov_steps_match_the_update_written_out():
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(6, 4))
    grad1, grad2 = torch.randn(6, 4), torch.randn(6, 4)
    lr, momentum, weight_decay = 0.02, 0.95, 0.1
    optimizer = Muon([param], lr=lr, momentum=momentum, weight_decay=weight_decay)
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
    Muon([param], lr=0.02, nesterov=False, ns_dtype=torch.float32).step()
    torch.testing.assert_close(param.detach(), expected, rtol=0, atol=0)


def test_same_shaped_matrices_stepped_together_match_one_optimizer_each():
    torch.manual_seed(3)
    shapes = [(8, 4), (8, 4), (4, 8), (8, 4), (6, 6)]
    together = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    alone = [torch.nn.Parameter(p.detach().clone()) for p in together]
    batched = Muon(together, lr=0.02, weight_decay=0.1, ns_dtype=torch.float32)
    singles = [Muon([p], lr=0.02, weight_decay=0.1, ns_dtype=torch.float32) for p in alone]
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
    optimizer = Muon([param], lr=0.05, momentum=0.9, nesterov=False)
    expected = param.detach().clone()
    for grad in (grad1, grad2):
        param.grad = grad.clone()
        optimizer.step()
    buffer2 = 0.9 * grad1 + grad2
    # A wide matrix has rows / cols < 1, so no shape scale.
    expected = expected - 0.05 * reference.newton_schulz5(grad1) - 0.05 * reference.newton_schulz5(buffer2)
    torch.testing.assert_close(param.detach(), expected, rtol=1e-5, atol=1e-6)


def test_tensors_that_are_not_2d_take_adamw_at_the_scaled_lr():
    # Step 1 of AdamW is p - lr * (g / (|g| + eps) + wd * p), with lr = group lr * adamw_lr / lr.
    param = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    grad = torch.tensor([0.3, -0.02, 0.001])
    optimizer = Muon([param], lr=0.02, adamw_lr=0.004, adamw_weight_decay=0.1, adamw_eps=1e-8)
    optimizer.param_groups[0]["lr"] = 0.01  # a schedule halving lr halves the AdamW lr too
    param.grad = grad
    p0 = param.detach().double().clone()
    optimizer.step()
    expected = p0 - 0.002 * (grad.double() / (grad.double().abs() + 1e-8) + 0.1 * p0)
    torch.testing.assert_close(param.detach().double(), expected, rtol=1e-6, atol=1e-8)


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
        (dict(lr=0.0), "lr"),
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
    ],
)
def test_invalid_argument_raises_value_error_naming_it(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_complex_params_are_rejected():
    with pytest.raises(ValueError, match="complex"):
        Muon([torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.complex64))])
