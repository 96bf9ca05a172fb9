"""mars.MARS: every backend against a plain per-tensor loop over mars.reference, plus the optimizer contract."""
import copy
import io
import pickle

import pytest
import torch

from mars import MARS, available_backends, reference
from mars.optimizer import OneRuleOptimizer, as_float, check_non_negative

# 1-D, 2-D (square, tall, wide, a single row/column) and 3-D tensors with odd sizes.
SHAPES = [(7, 5), (13,), (3, 4, 2), (1, 9), (9, 1), (5,), (17, 11)]
# (parameter index, steps at which it has no gradient)
NO_GRAD_AT = {2: {3, 4}, 4: {4, 5, 6}}
STEPS = 12
KWARGS = dict(lr=3e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, gamma=0.025, lr_1d=1e-3,
              betas_1d=(0.8, 0.9), weight_decay_1d=0.05)
# Triton under the interpreter takes about a second per trajectory, so it gets a sample of the variants below.
CPU_BACKENDS = ["reference", "torch"]
needs_triton = pytest.mark.skipif("triton" not in available_backends("cpu"),
                                  reason="needs triton and TRITON_INTERPRET=1 (set by tests/conftest.py)")


def lr_at(step):
    """A schedule that changes the group lr every step (warm-up then decay)."""
    return KWARGS["lr"] * min(step, 4) / 4 / (1 + 0.1 * step)


def random_trajectory(seed, dtype=torch.float32):
    """Initial parameters, then per step the gradients and lookahead gradients (None: no gradient)."""
    generator = torch.Generator().manual_seed(seed)
    params = [torch.randn(shape, generator=generator).to(dtype) for shape in SHAPES]

    def grads_at(step):
        # Alternate small and large gradients so that the norm clip is both on and off along the way.
        scale = 0.05 if step % 2 else 3.0
        return [
            None if step in NO_GRAD_AT.get(i, ()) else (torch.randn(shape, generator=generator) * scale).to(dtype)
            for i, shape in enumerate(SHAPES)
        ]

    steps = [(grads_at(step), grads_at(step)) for step in range(1, STEPS + 1)]
    return params, steps


def expected_params(params, steps, *, mars_type, is_approx, amsgrad, optimize_1d):
    """The trajectory written with mars.reference one tensor at a time, as the official optimizer runs it."""
    params = [p.clone() for p in params]
    state = [dict(step=0, exp_avg=torch.zeros(p.shape), exp_avg_sq=torch.zeros(p.shape),
                  max_exp_avg_sq=torch.zeros(p.shape), last_grad=torch.zeros(p.shape), previous_grad=None)
             for p in params]
    beta1, beta2 = KWARGS["betas"]
    for step, (grads, lookahead_grads) in enumerate(steps, start=1):
        lr = lr_at(step)
        for param, grad, lookahead, s in zip(params, grads, lookahead_grads, state):
            if not is_approx and lookahead is not None:
                s["previous_grad"] = lookahead.float()
            if grad is None:
                continue
            s["step"] += 1
            if reference.uses_mars_rule(param, optimize_1d):
                reference.mars_step(
                    param, grad, s["last_grad"], s["exp_avg"], s["exp_avg_sq"], s["max_exp_avg_sq"],
                    step=s["step"], lr=lr, beta1=beta1, beta2=beta2, eps=KWARGS["eps"],
                    weight_decay=KWARGS["weight_decay"], gamma=KWARGS["gamma"], mars_type=mars_type,
                    amsgrad=amsgrad,
                )
                if is_approx:
                    s["last_grad"] = grad.float()
            else:
                beta1_1d, beta2_1d = KWARGS["betas_1d"]
                reference.adamw_step(
                    param, grad, s["exp_avg"], s["exp_avg_sq"], s["max_exp_avg_sq"], step=s["step"],
                    lr=lr * (KWARGS["lr_1d"] / KWARGS["lr"]), beta1=beta1_1d, beta2=beta2_1d, eps=KWARGS["eps"],
                    weight_decay=KWARGS["weight_decay_1d"], amsgrad=amsgrad,
                )
        for s in state:
            if s["previous_grad"] is not None:
                s["last_grad"] = s["previous_grad"].clone()
    return params, [s["step"] for s in state]


def set_grads(params, grads):
    for param, grad in zip(params, grads):
        param.grad = None if grad is None else grad.clone()


def run_mars(params, steps, **options):
    """Run MARS through ``steps`` with a LambdaLR schedule, which sets lr (lr_1d follows at its ratio to lr); an empty
    param group rides along."""
    params = [torch.nn.Parameter(p.clone()) for p in params]
    optimizer = MARS([{"params": params}, {"params": []}], **KWARGS, **options)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: lr_at(i + 1) / KWARGS["lr"])
    for grads, lookahead_grads in steps:
        if optimizer.needs_lookahead_grad:
            set_grads(params, lookahead_grads)
            optimizer.stash_lookahead_grad()
            optimizer.zero_grad()
        set_grads(params, grads)
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return optimizer, params


def assert_same_trajectory(backend, dtype, **variant):
    params, steps = random_trajectory(seed=sum(map(ord, str(variant))), dtype=dtype)
    optimizer, actual = run_mars(params, steps, backend=backend, **variant)
    expected, expected_steps = expected_params(params, steps, **variant)
    if backend == "reference":
        tolerance = dict(rtol=0, atol=0)
    elif dtype == torch.float32:
        tolerance = dict(rtol=1e-5, atol=1e-6)
    else:
        # Rounding differences in float32 can flip the rounding of the stored bfloat16 value by one ulp.
        tolerance = dict(rtol=2 * 2**-8, atol=1e-3)
    for a, e in zip(actual, expected):
        assert a.dtype == dtype
        torch.testing.assert_close(a.detach(), e, **tolerance)
    assert [optimizer.state[p].get("step", 0) for p in actual] == expected_steps
    for state in optimizer.state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if torch.is_tensor(v))


@pytest.mark.slow
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mars_type", reference.MARS_TYPES)
@pytest.mark.parametrize("is_approx", [True, False], ids=["approx", "exact"])
@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("optimize_1d", [False, True], ids=["adamw_1d", "mars_1d"])
def test_backend_follows_reference_trajectory_in_float32(backend, mars_type, is_approx, amsgrad, optimize_1d):
    assert_same_trajectory(backend, torch.float32, mars_type=mars_type, is_approx=is_approx, amsgrad=amsgrad,
                           optimize_1d=optimize_1d)


@pytest.mark.slow
@needs_triton
@pytest.mark.triton_interpreter
@pytest.mark.parametrize(
    "mars_type, is_approx, amsgrad, optimize_1d",
    [("mars-adamw", True, False, False), ("mars-adamw", False, True, True), ("mars-lion", True, False, True),
     ("mars-shampoo", False, True, False)],
)
def test_triton_backend_follows_reference_trajectory_in_float32(mars_type, is_approx, amsgrad, optimize_1d):
    assert_same_trajectory("triton", torch.float32, mars_type=mars_type, is_approx=is_approx, amsgrad=amsgrad,
                           optimize_1d=optimize_1d)


# Not Triton here: its interpreter truncates float32 -> bfloat16 casts (the GPU rounds to nearest even), so a
# bfloat16 trajectory drifts by design on the CPU.
@pytest.mark.slow
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mars_type", reference.MARS_TYPES)
@pytest.mark.parametrize("is_approx", [True, False], ids=["approx", "exact"])
def test_backend_follows_reference_trajectory_for_bfloat16_params_with_float32_state(backend, mars_type, is_approx):
    assert_same_trajectory(backend, torch.bfloat16, mars_type=mars_type, is_approx=is_approx, amsgrad=False,
                           optimize_1d=False)


# The Triton backend checks its inputs again only when something the checks read can have changed (see
# mars.triton_backend._checked_launch_groups). Each test below changes something between steps of the same
# optimizer and holds the Triton backend to the reference or to its checks; the kernels' own tests cover the rest.

def triton_and_reference(run):
    """``run(backend)``'s parameters with the Triton backend, checked against the reference backend's."""
    for actual, expected in zip(run("triton"), run("reference")):
        torch.testing.assert_close(actual.detach(), expected.detach(), rtol=1e-5, atol=1e-6)


def seeded_grads(params, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(param.shape, generator=generator) for param in params]


@needs_triton
@pytest.mark.triton_interpreter
def test_triton_with_set_to_none_grads_at_new_addresses_follows_the_reference():
    def run(backend):
        params = [torch.nn.Parameter(torch.ones(5, 4)), torch.nn.Parameter(torch.ones(6))]
        optimizer = MARS(params, backend=backend, **KWARGS)
        all_grads = []  # kept alive, so that each step's gradients are new tensors at new addresses
        for step in range(3):
            optimizer.zero_grad(set_to_none=True)
            for param, grad in zip(params, seeded_grads(params, step)):
                param.grad = grad
            all_grads.append([param.grad for param in params])
            optimizer.step()
        return params

    triton_and_reference(run)


@needs_triton
@pytest.mark.triton_interpreter
def test_triton_steps_a_param_group_added_after_checked_steps_as_the_reference():
    def run(backend):
        first, added = [torch.nn.Parameter(torch.ones(5, 4))], [torch.nn.Parameter(torch.ones(3, 6))]
        optimizer = MARS(first, backend=backend, **KWARGS)
        for step in range(4):
            if step == 2:
                optimizer.add_param_group({"params": added, "lr": 1e-2})
            params = [p for group in optimizer.param_groups for p in group["params"]]
            for param, grad in zip(params, seeded_grads(params, step)):
                param.grad = grad
            optimizer.step()
        assert [optimizer.state[p]["step"] for p in first + added] == [4, 2]
        return first + added

    triton_and_reference(run)


def saved_state_dict(shapes, backend="reference", lagging=None):
    """The state_dict, as bytes, of an optimizer after three steps on ``shapes``; param ``lagging`` missed the
    second step's gradient, so that its step count is behind."""
    params = [torch.nn.Parameter(torch.ones(shape)) for shape in shapes]
    optimizer = MARS(params, backend=backend, **KWARGS)
    for step in range(3):
        for i, (param, grad) in enumerate(zip(params, seeded_grads(params, step))):
            param.grad = None if (i, step) == (lagging, 1) else grad
        optimizer.step()
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return buffer.getvalue()


def stepped_optimizer(shapes, backend, steps):
    """An optimizer on ones-initialised parameters of ``shapes`` after ``steps`` steps, and its parameters."""
    params = [torch.nn.Parameter(torch.ones(shape)) for shape in shapes]
    optimizer = MARS(params, backend=backend, **KWARGS)
    for step in range(steps):
        for param, grad in zip(params, seeded_grads(params, 10 + step)):
            param.grad = grad
        optimizer.step()
    return optimizer, params


@needs_triton
@pytest.mark.triton_interpreter
def test_triton_step_after_load_state_dict_equals_a_fresh_optimizer_loaded_the_same_way():
    # The loaded tensors are at different steps, the optimizer's own were not: they must be checked and grouped
    # afresh.
    shapes = [(5, 4), (3, 6)]
    saved = saved_state_dict(shapes, lagging=1)

    def run(backend):
        optimizer, params = stepped_optimizer(shapes, backend, steps=2 if backend == "triton" else 0)
        optimizer.load_state_dict(torch.load(io.BytesIO(saved), weights_only=True))
        for param, grad in zip(params, seeded_grads(params, 20)):
            param.data.fill_(0.5)
            param.grad = grad
        optimizer.step()
        assert [optimizer.state[p]["step"] for p in params] == [4, 3]
        return params

    triton_and_reference(run)


@needs_triton
@pytest.mark.triton_interpreter
def test_triton_refuses_a_loaded_state_that_does_not_fit_its_params_after_checked_steps():
    # As many elements, another shape: the state of a model whose weight is stored transposed.
    optimizer, _ = stepped_optimizer([(5, 4)], "triton", steps=2)
    optimizer.load_state_dict(torch.load(io.BytesIO(saved_state_dict([(4, 5)])), weights_only=True))
    with pytest.raises(ValueError, match="has shape \\(4, 5\\), its param \\(5, 4\\)"):
        optimizer.step()


def shampoo_trajectory(backend, ns_dtype, shapes, steps=5, ns_form="products"):
    torch.manual_seed(11)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in shapes]
    optimizer = MARS(params, lr=1e-2, weight_decay=0.1, mars_type="mars-shampoo", backend=backend, ns_dtype=ns_dtype,
                     ns_form=ns_form)
    for _ in range(steps):
        for param in params:
            param.grad = torch.randn(param.shape) * 0.1
        optimizer.step()
    return [p.detach() for p in params]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("is_approx", [True, False], ids=["approx", "exact"])
def test_shampoo_fast_path_steps_bit_for_bit_as_the_reference(dtype, is_approx):
    # Gradient scales cycle so that c_t is clipped on some steps and not on others; matrices tall, wide and square,
    # large enough that a last-bit difference of the weight decay's rounding shows
    # (the 1-D tensors' AdamW is the backends' own: not compared here).
    shapes, scales = [(96, 32), (32, 96), (64, 64)], (3.0, 1e-3, 1e-3, 0.3)
    generator = torch.Generator().manual_seed(5)
    initial = [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]
    grads = [[(torch.randn(shape, generator=generator) * scale).to(dtype) for shape in shapes] for scale in scales * 2]
    runs = {}
    for backend in ("reference", "torch"):
        params = [torch.nn.Parameter(p.clone()) for p in initial]
        optimizer = MARS(params, lr=1e-2, weight_decay=0.1, mars_type="mars-shampoo", is_approx=is_approx,
                         backend=backend, ns_dtype=torch.float32)
        for step, step_grads in enumerate(grads):
            if not is_approx:
                for param, grad in zip(params, grads[(step + 1) % len(grads)]):
                    param.grad = grad.clone()
                optimizer.stash_lookahead_grad()
            for param, grad in zip(params, step_grads):
                param.grad = grad.clone()
            optimizer.step()
        runs[backend] = (optimizer, params)
    (reference_optimizer, expected), (optimizer, params) = runs["reference"], runs["torch"]
    for param, expected_param in zip(params, expected):
        assert torch.equal(param, expected_param)
        # The reference also keeps an exp_avg_sq for 2-D tensors that its shampoo rule never reads.
        for key, value in optimizer.state[param].items():
            expected_value = reference_optimizer.state[expected_param][key]
            assert torch.equal(value, expected_value) if torch.is_tensor(value) else value == expected_value


def test_shampoo_fast_path_reads_no_tensor_on_the_host(monkeypatch):
    # A read of a tensor's value (bool, item, tolist) makes a GPU step wait: an eager step reads a tensor lr once.
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(12, 4), (4, 12)]]
    optimizer = MARS(params, mars_type="mars-shampoo", backend="torch", ns_dtype=torch.float32)
    for param in params:
        param.grad = torch.randn(param.shape) * 10  # clipped: an `if norm > 1` would read the norm

    def host_read(*args, **kwargs):
        raise AssertionError("a tensor was read on the host")
    for name in ("__bool__", "item", "tolist", "__float__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    optimizer.step()
    monkeypatch.undo()
    with pytest.raises(AssertionError, match="read on the host"):  # the check bites
        for name in ("__bool__", "item", "tolist", "__float__"):
            monkeypatch.setattr(torch.Tensor, name, host_read)
        as_float(torch.tensor(1e-3))


def test_shampoo_batches_same_shaped_matrices_with_the_reference_math():
    shapes = [(8, 6), (8, 6), (6, 8), (8, 6), (5,)]
    batched = shampoo_trajectory("torch", torch.float32, shapes)
    one_by_one = shampoo_trajectory("reference", torch.float32, shapes)
    for a, b in zip(batched, one_by_one):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_shampoo_ns_dtype_is_the_newton_schulz_precision():
    shapes = [(8, 6), (6, 8)]  # distinct shapes: the same path in both backends
    bfloat16 = shampoo_trajectory("reference", torch.bfloat16, shapes)
    assert all(torch.equal(a, b) for a, b in zip(bfloat16, shampoo_trajectory("torch", torch.bfloat16, shapes)))
    float32 = shampoo_trajectory("reference", torch.float32, shapes)
    assert not torch.allclose(bfloat16[0], float32[0], rtol=0, atol=1e-6)


def test_shampoo_ns_form_orders_the_products_of_the_same_polynomial():
    shapes = [(8, 6), (6, 8), (5,)]
    authors = shampoo_trajectory("torch", torch.float32, shapes)
    for a, b in zip(shampoo_trajectory("torch", torch.float32, shapes, ns_form="fused_gram"), authors):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    fused = shampoo_trajectory("torch", torch.bfloat16, shapes, ns_form="fused_gram")
    assert not torch.equal(fused[0], shampoo_trajectory("torch", torch.bfloat16, shapes)[0])
    with pytest.raises(ValueError, match="^ns_form='gram' must"):
        MARS([torch.nn.Parameter(torch.zeros(2, 2))], mars_type="mars-shampoo", ns_form="gram")


@pytest.mark.parametrize("is_approx", [True, False])
def test_a_copy_steps_as_the_original(is_approx):
    torch.manual_seed(3)
    param = torch.nn.Parameter(torch.randn(4, 3))
    optimizer = MARS([param], is_approx=is_approx, backend="reference")
    for _ in range(2):
        param.grad = torch.randn(4, 3)
        if not is_approx:
            optimizer.stash_lookahead_grad()
        optimizer.step()
    if not is_approx:
        optimizer.stash_lookahead_grad()
    param.grad = torch.randn(4, 3)
    copied_param, copied = copy.deepcopy((param, optimizer))
    copied_param.grad = param.grad.clone()  # a deep copy of a Parameter leaves its .grad behind
    assert (copied.is_approx, copied.backend) == (is_approx, "reference")
    optimizer.step()
    copied.step()
    torch.testing.assert_close(copied_param, param, rtol=0, atol=0)


def test_params_without_grad_are_skipped_and_keep_their_step_count():
    params = [torch.nn.Parameter(torch.randn(3, 3)) for _ in range(2)]
    frozen = params[1].detach().clone()
    optimizer = MARS(params, backend="torch")
    for _ in range(3):
        params[0].grad = torch.randn(3, 3)
        optimizer.step()
    assert optimizer.state[params[0]]["step"] == 3
    assert len(optimizer.state[params[1]]) == 0
    torch.testing.assert_close(params[1].detach(), frozen, rtol=0, atol=0)


def test_one_dim_params_take_adamw_with_weight_decay_1d_at_lr_1d_scaled_as_the_group_lr():
    # Step 1 of AdamW is p - lr_1d * (g / (|g| + eps) + weight_decay_1d * p), lr_1d following the group's lr.
    param = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0]))
    grad = torch.tensor([0.3, -0.02, 0.001])
    optimizer = MARS([param], lr=0.01, lr_1d=0.001, weight_decay=0.5, weight_decay_1d=0.1, eps=1e-8)
    optimizer.param_groups[0]["lr"] = 0.005  # a schedule halves lr: lr_1d follows, to 0.0005
    param.grad = grad
    expected = param.detach().double() - 0.0005 * (grad.double() / (grad.double().abs() + 1e-8)
                                                  + 0.1 * param.detach().double())
    optimizer.step()
    torch.testing.assert_close(param.detach().double(), expected, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("is_approx", [True, False], ids=["approx", "exact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_round_trip_gives_identical_next_step(backend, is_approx, dtype):
    params, steps = random_trajectory(seed=3, dtype=dtype)
    options = dict(backend=backend, is_approx=is_approx, amsgrad=True)
    optimizer, trained = run_mars(params, steps[:-1], **options)

    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in trained]
    resumed = MARS([{"params": resumed_params}, {"params": []}], **KWARGS, **options)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))

    for state in resumed.state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if torch.is_tensor(v))
    grads, lookahead_grads = steps[-1]
    for opt, ps in ((optimizer, trained), (resumed, resumed_params)):
        if opt.needs_lookahead_grad:
            set_grads(ps, lookahead_grads)
            opt.stash_lookahead_grad()
        set_grads(ps, grads)
        opt.step()
    for a, b in zip(trained, resumed_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for p, q in zip(trained, resumed_params):
        for key, value in optimizer.state[p].items():
            torch.testing.assert_close(resumed.state[q][key], value, rtol=0, atol=0)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_zero_grad_without_set_to_none_does_not_change_the_remembered_gradient(backend):
    # The official approximate scheme keeps a reference to p.grad; zeroing and refilling the same buffer
    # would then overwrite the remembered gradient with the new one.
    torch.manual_seed(0)
    grad1, grad2 = torch.randn(6, 4), torch.randn(6, 4)
    in_place = torch.nn.Parameter(torch.randn(6, 4))
    fresh = torch.nn.Parameter(in_place.detach().clone())
    in_place_optimizer, fresh_optimizer = MARS([in_place], backend=backend), MARS([fresh], backend=backend)

    in_place.grad = grad1.clone()
    in_place_optimizer.step()
    in_place_optimizer.zero_grad(set_to_none=False)
    in_place.grad.add_(grad2)
    in_place_optimizer.step()

    for grad in (grad1, grad2):
        fresh.grad = grad.clone()
        fresh_optimizer.step()
    torch.testing.assert_close(in_place, fresh, rtol=0, atol=0)
    torch.testing.assert_close(in_place_optimizer.state[in_place]["last_grad"], grad2, rtol=0, atol=0)


def train_tiny_model(call_sequence, mars_type, backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3))
    optimizer = MARS(model.parameters(), lr=1e-2, weight_decay=0.1, is_approx=False, mars_type=mars_type,
                     backend=backend)
    batches = [(torch.randn(16, 6), torch.randn(16, 3)) for _ in range(9)]

    def backward(batch):
        inputs, targets = batch
        torch.nn.functional.mse_loss(model(inputs), targets).backward()

    for step in range(len(batches) - 1):
        backward(batches[step + 1])
        if call_sequence == "official":
            optimizer.update_previous_grad()
        else:
            optimizer.stash_lookahead_grad()
        optimizer.zero_grad(set_to_none=True)
        backward(batches[step])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if call_sequence == "official":
            optimizer.update_last_grad()
    return [p.detach() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("mars_type", reference.MARS_TYPES)
def test_exact_scheme_official_call_sequence_and_clean_api_agree(backend, mars_type):
    official = train_tiny_model("official", mars_type, backend)
    clean = train_tiny_model("clean", mars_type, backend)
    for a, b in zip(official, clean):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_needs_lookahead_grad_is_true_only_for_the_exact_scheme():
    param = [torch.nn.Parameter(torch.zeros(2, 2))]
    assert MARS(param, is_approx=False).needs_lookahead_grad
    assert not MARS(param, is_approx=True).needs_lookahead_grad


def test_exact_scheme_step_without_stash_raises():
    param = torch.nn.Parameter(torch.zeros(2, 2))
    optimizer = MARS([param], is_approx=False)
    param.grad = torch.ones(2, 2)
    optimizer.stash_lookahead_grad()
    optimizer.step()
    with pytest.raises(RuntimeError, match="stash_lookahead_grad"):
        optimizer.step()


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(lr=-1e-3), "lr"),
        (dict(lr_1d=-1e-3), "lr_1d"),
        (dict(eps=-1e-8), "eps"),
        (dict(betas=(1.0, 0.99)), "betas"),
        (dict(betas=(0.9, -0.1)), "betas"),
        (dict(betas=(0.9,)), "betas"),
        (dict(betas_1d=(0.9, 1.0)), "betas_1d"),
        (dict(gamma=-0.1), "gamma"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(weight_decay_1d=-0.1), "weight_decay_1d"),
        (dict(mars_type="mars-sgd"), "mars_type"),
        (dict(backend="cuda"), "backend"),
    ],
)
def test_invalid_argument_raises_value_error_naming_it(kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        MARS([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_invalid_param_group_override_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="^eps must"):
        MARS([{"params": [torch.nn.Parameter(torch.zeros(2, 2))], "eps": -1.0}])


def test_complex_params_are_rejected():
    with pytest.raises(ValueError, match="complex"):
        MARS([torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.complex64))])


def test_sparse_gradients_are_rejected():
    param = torch.nn.Parameter(torch.zeros(3, 3))
    param.grad = torch.eye(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        MARS([param], backend="torch").step()


def test_triton_backend_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    param = torch.nn.Parameter(torch.zeros(3, 3))
    param.grad = torch.ones(3, 3)
    optimizer = MARS([param], backend="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        optimizer.step()
    torch.testing.assert_close(param.detach(), torch.zeros(3, 3), rtol=0, atol=0)


def test_auto_backend_uses_torch_for_cpu_tensors():
    param = torch.nn.Parameter(torch.randn(4, 4))
    reference_param = copy.deepcopy(param)
    grad = torch.randn(4, 4)
    for p, backend in ((param, "auto"), (reference_param, "torch")):
        p.grad = grad.clone()
        MARS([p], backend=backend).step()
    torch.testing.assert_close(param, reference_param, rtol=0, atol=0)


class PlainSGD(OneRuleOptimizer):
    """A one-rule optimizer written as its rule alone: no option of the whole optimizer, Newton-Schulz's neither."""

    def __init__(self, params, lr: float = 0.1, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))

    def _check_group(self, group):
        check_non_negative(weight_decay=group["weight_decay"])

    def _update(self, params, group):
        torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        torch._foreach_add_(params, [param.grad for param in params], alpha=-group["lr"])


def test_a_one_rule_optimizer_steps_every_tensor_by_its_rule_whatever_its_shape():
    shapes = [(3, 2), (2,), (), (2, 3, 4)]
    params = [torch.nn.Parameter(torch.ones(shape)) for shape in shapes]
    without_grad = torch.nn.Parameter(torch.ones(2, 2))
    optimizer = PlainSGD([{"params": params[:2]}, {"params": [*params[2:], without_grad], "lr": 0.5}],
                         weight_decay=0.5)
    for param in params:
        param.grad = torch.full_like(param, 2.0)
    optimizer.step()
    for param, lr in zip(params, [0.1, 0.1, 0.5, 0.5]):
        assert torch.equal(param.detach(), torch.full_like(param, (1 - lr * 0.5) - lr * 2.0))
    assert torch.equal(without_grad.detach(), torch.ones(2, 2))
    with pytest.raises(ValueError, match="weight_decay must be >= 0, got -1"):
        PlainSGD(params, weight_decay=-1.0)
    with pytest.raises(ValueError, match="lr must be >= 0"):
        PlainSGD(params, lr=-0.1)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_subclass_of_the_generic_base_without_newton_schulz_options_copies_or_pickles_and_steps(how):
    params = [torch.nn.Parameter(torch.ones(3, 2)), torch.nn.Parameter(torch.ones(2))]
    optimizer = PlainSGD(params)
    copy_of = copy.deepcopy if how == "deepcopy" else lambda obj: pickle.loads(pickle.dumps(obj))
    copied_params, copied = copy_of((params, optimizer))
    for each_params, each in ((params, optimizer), (copied_params, copied)):
        for param in each_params:
            param.grad = torch.full_like(param, 2.0)
        each.step()
    for param, copied_param in zip(params, copied_params):
        assert torch.equal(param.detach(), torch.full_like(param, 0.8))
        assert torch.equal(copied_param.detach(), param.detach())
