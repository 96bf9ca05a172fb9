"""MARS-M and Moonlight: mars.reference against the MARS-M authors' code transcribed line by line (AGI-Arena/MARS
``MARS_M/optimizers/``), the optimizers (MarsM, MarsMEfficient, Moonlight) against mars.reference on both paths
(tensor by tensor, and foreach), the two paths against each other, batching, DDP sharing, state_dict and pickle
round trips (across the paths too), the exact scheme's protocol, validation."""
import io
import math
import pickle

import pytest
import torch
import torch.distributed as dist

from mars import MarsM, MarsMEfficient, Moonlight, mars_m_foreach, reference
# A fixture starting a one-process Gloo group; its module imports torch.distributed.nn before any group exists.
from tests.mars.test_newton_schulz import run_on_simulated_ranks
from tests.mars.test_process_group import start_group  # noqa: F401

LR, WEIGHT_DECAY, MOMENTUM, GAMMA, NS_STEPS = 0.02, 0.1, 0.9, 0.05, 5
ADAMW_BETAS, ADAMW_EPS = (0.9, 0.95), 1e-8
VARIANTS = {
    "approx": dict(kind="mars-m", is_approx=True, clip_c=True),
    "approx-unclipped": dict(kind="mars-m", is_approx=True, clip_c=False),
    "exact": dict(kind="mars-m", is_approx=False, clip_c=True),
    "exact-unclipped": dict(kind="mars-m", is_approx=False, clip_c=False),
    "efficient": dict(kind="efficient"),
    "moonlight": dict(kind="moonlight", nesterov=True),
    "moonlight-plain": dict(kind="moonlight", nesterov=False),
}
# Gradient scales cycled over the steps: c_t longer than 1 on some steps, shorter on others; AdamW near its eps.
GRAD_SCALES = (1.0, 0.05, 1e-3, 0.3, 1e-8)


# The authors' code, transcribed from MARS_M/optimizers/*.py line by line: state created as their code creates it
# (in the parameter's dtype), Newton-Schulz eager and in ``ns_dtype`` where theirs casts to bfloat16.

def their_newton_schulz(G, steps, ns_dtype):
    """mars_m.py:5-34 (the same in moonlight.py and mars_m_efficient.py) for a 2-D G."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.to(ns_dtype)
    if G.size(0) > G.size(1):
        X = X.T
    X = X / (X.norm() + 1e-7)
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


def their_adjusted_lr(lr, param_shape):
    """mars_m.py:102-108."""
    A, B = param_shape[:2]
    adjusted_ratio = 0.2 * math.sqrt(max(A, B))
    return lr * adjusted_ratio


def their_orthogonalised_step(p, u, lr, wd):
    """mars_m.py:207-214: weight decay with lr, the update with the adjusted lr."""
    adjusted_lr = their_adjusted_lr(lr, p.shape)
    p.mul_(1 - lr * wd)
    p.add_(u, alpha=-adjusted_lr)


def their_mars_m_step(p, g, state, lr, wd, ns_dtype, is_approx, clip_c):
    """mars_m.py:182-216; ``clip_c=False`` drops lines 198-200, which their code runs whatever its flag says."""
    mars_factor = GAMMA * MOMENTUM / (1 - MOMENTUM)
    if "last_grad" not in state:
        state["last_grad"] = torch.zeros_like(g)
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(g)
    c_t = (g - state["last_grad"]).mul(mars_factor).add(g)
    if clip_c:
        c_t_norm = c_t.norm()
        if c_t_norm > 1:
            c_t.div_(c_t_norm)
    buf = state["momentum_buffer"]
    buf.mul_(MOMENTUM).add_(c_t, alpha=(1 - MOMENTUM))
    u = their_newton_schulz(buf, NS_STEPS, ns_dtype)
    their_orthogonalised_step(p, u, lr, wd)
    if is_approx:
        state["last_grad"] = g


def their_efficient_step(p, g, state, lr, wd, ns_dtype):
    """mars_m_efficient.py:124-152."""
    momentum_factor = (1 - GAMMA) * (1 - MOMENTUM) / MOMENTUM
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(g)
    buf = state["momentum_buffer"]
    buf.mul_(MOMENTUM).add_(g, alpha=momentum_factor)
    g = g.mul(GAMMA).add(buf, alpha=MOMENTUM)
    u = their_newton_schulz(g, NS_STEPS, ns_dtype)
    their_orthogonalised_step(p, u, lr, wd)


def their_moonlight_step(p, g, state, lr, wd, ns_dtype, nesterov):
    """moonlight.py:133-161."""
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(g)
    buf = state["momentum_buffer"]
    buf.mul_(MOMENTUM).add_(g)
    if nesterov:
        g = g.add(buf, alpha=MOMENTUM)
    else:
        g = buf
    u = their_newton_schulz(g, NS_STEPS, ns_dtype)
    their_orthogonalised_step(p, u, lr, wd)


def their_adamw_step(p, g, state, lr, weight_decay):
    """mars_m.py:222-250 (moonlight.py:167-195, mars_m_efficient.py:158-186)."""
    beta1, beta2 = ADAMW_BETAS
    eps = ADAMW_EPS
    if "step" not in state:
        state["step"] = 0
        state["moment1"] = torch.zeros_like(g)
        state["moment2"] = torch.zeros_like(g)
    state["step"] += 1
    step = state["step"]
    buf1 = state["moment1"]
    buf2 = state["moment2"]
    buf1.lerp_(g, 1 - beta1)
    buf2.lerp_(g.square(), 1 - beta2)
    g = buf1 / (eps + buf2.sqrt())
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    scale = bias_correction1 / bias_correction2**0.5
    p.mul_(1 - lr * weight_decay)
    p.add_(g, alpha=-lr / scale)


def their_trajectory(variant, initial, steps, ns_dtype):
    """Their optimizer over ``steps`` ((grads, look-ahead grads, lr) each), with their trainer's exact-scheme calls
    (train_mars_m.py:381 update_previous_grad, :410 step, :414 update_last_grad). 2-D tensors take the matrix rule."""
    kind, params, states = variant["kind"], [p.clone() for p in initial], [{} for _ in initial]
    exact = kind == "mars-m" and not variant["is_approx"]
    for grads, lookahead_grads, lr in steps:
        if exact:  # update_previous_grad (mars_m.py:124-138)
            for p, la, state in zip(params, lookahead_grads, states):
                if p.dim() == 2:
                    state["previous_grad"] = torch.zeros_like(p).add_(la, alpha=1.0)
        for p, g, state in zip(params, grads, states):
            if p.dim() != 2:
                their_adamw_step(p, g, state, lr, WEIGHT_DECAY)
            elif kind == "mars-m":
                their_mars_m_step(p, g, state, lr, WEIGHT_DECAY, ns_dtype, variant["is_approx"], variant["clip_c"])
            elif kind == "efficient":
                their_efficient_step(p, g, state, lr, WEIGHT_DECAY, ns_dtype)
            else:
                their_moonlight_step(p, g, state, lr, WEIGHT_DECAY, ns_dtype, variant["nesterov"])
        if exact:  # update_last_grad (mars_m.py:111-122)
            for p, state in zip(params, states):
                if p.dim() == 2:
                    state["last_grad"] = torch.zeros_like(p).add_(state["previous_grad"], alpha=1.0)
    return params


def reference_trajectory(variant, initial, steps, ns_dtype, state_dtype=torch.float32, matrix_rule=None):
    """mars.reference over the same steps; ``matrix_rule[i]`` says whether tensor i takes the matrix rule (by
    default the 2-D ones). The scheme decides what ``last_grad`` holds next, as MarsM does."""
    kind, params = variant["kind"], [p.clone() for p in initial]
    matrix_rule = matrix_rule or [p.dim() == 2 for p in initial]
    buffers = [{key: torch.zeros_like(p, dtype=state_dtype) for key in ("last", "momentum", "m", "v")}
               for p in initial]
    for step, (grads, lookahead_grads, lr) in enumerate(steps, start=1):
        for p, g, la, buf, is_matrix in zip(params, grads, lookahead_grads, buffers, matrix_rule):
            hyper = dict(lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, ns_steps=NS_STEPS, ns_dtype=ns_dtype)
            if not is_matrix:
                reference.mars_m_adamw_step(p, g, buf["m"], buf["v"], step=step, lr=lr, beta1=ADAMW_BETAS[0],
                                            beta2=ADAMW_BETAS[1], eps=ADAMW_EPS, weight_decay=WEIGHT_DECAY)
            elif kind == "mars-m":
                reference.mars_m_step(p, g, buf["last"], buf["momentum"], gamma=GAMMA, clip_c=variant["clip_c"],
                                      **hyper)
                buf["last"].copy_(g if variant["is_approx"] else la)
            elif kind == "efficient":
                reference.mars_m_efficient_step(p, g, buf["momentum"], gamma=GAMMA, **hyper)
            else:
                reference.moonlight_step(p, g, buf["momentum"], nesterov=variant["nesterov"], **hyper)
    return params


def random_steps(shapes, n_steps, dtype, seed):
    """Initial tensors and ``n_steps`` of (gradients, look-ahead gradients, lr), the lr decaying as a schedule."""
    generator = torch.Generator().manual_seed(seed)

    def randn(shape, scale=1.0):
        return (torch.randn(shape, generator=generator, dtype=torch.float64) * scale).to(dtype)

    initial = [randn(shape) for shape in shapes]
    steps = []
    for t in range(n_steps):
        scale = GRAD_SCALES[t % len(GRAD_SCALES)]
        steps.append(([randn(s, scale) for s in shapes], [randn(s, scale) for s in shapes], LR * (1 - 0.04 * t)))
    return initial, steps


SHAPES = [(12, 4), (4, 12), (8, 8), (9,), (3,)]  # tall, wide, square, and AdamW's 1-D tensors


@pytest.mark.parametrize("name", VARIANTS)
def test_reference_is_the_authors_code_bit_for_bit_in_float32_with_bfloat16_newton_schulz(name):
    initial, steps = random_steps(SHAPES, 12, torch.float32, seed=len(name))
    theirs = their_trajectory(VARIANTS[name], initial, steps, torch.bfloat16)
    ours = reference_trajectory(VARIANTS[name], initial, steps, torch.bfloat16)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_reference_is_the_authors_code_in_float64(name):
    initial, steps = random_steps(SHAPES, 12, torch.float64, seed=100 + len(name))
    theirs = their_trajectory(VARIANTS[name], initial, steps, torch.float64)
    ours = reference_trajectory(VARIANTS[name], initial, steps, torch.float64, state_dtype=torch.float64)
    moved = [(b - a).abs().max() for a, b in zip(initial, theirs)]
    assert min(moved) > 1e-3  # every tensor really moved
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_the_clip_changes_the_trajectory_and_both_schemes_differ():
    initial, steps = random_steps(SHAPES[:3], 10, torch.float64, seed=7)
    runs = {name: reference_trajectory(VARIANTS[name], initial, steps, torch.float64, torch.float64)
            for name in ("approx", "approx-unclipped", "exact")}
    for other in ("approx-unclipped", "exact"):
        assert all((a - b).abs().max() > 1e-6 for a, b in zip(runs["approx"], runs[other]))


def test_efficient_direction_is_the_unclipped_approximate_mars_m_momentum():
    # Their efficient buffer b is (m - gamma g) / beta for MARS-M's momentum m: the orthogonalised matrix is m.
    torch.manual_seed(0)
    momentum, last_grad, efficient = (torch.zeros(6, 5, dtype=torch.float64) for _ in range(3))
    for _ in range(10):
        grad = torch.randn(6, 5, dtype=torch.float64)
        m = reference.mars_m_momentum(grad, last_grad, momentum, momentum=MOMENTUM, gamma=GAMMA, clip_c=False)
        d = reference.mars_m_efficient_direction(grad, efficient, momentum=MOMENTUM, gamma=GAMMA)
        last_grad.copy_(grad)
        torch.testing.assert_close(d, m, rtol=1e-12, atol=1e-13)


def test_authors_newton_schulz_and_ours_are_the_same_polynomial_apart_by_bfloat16_rounding():
    torch.manual_seed(1)
    for shape in [(64, 16), (16, 64), (32, 32)]:
        matrix = torch.randn(shape)
        theirs64 = reference.newton_schulz5_gram_polynomial(matrix.double(), dtype=torch.float64)
        ours64 = reference.newton_schulz5(matrix.double(), eps=1e-7, dtype=torch.float64, norm_in_dtype=True)
        torch.testing.assert_close(theirs64, ours64, rtol=1e-12, atol=1e-12)
        theirs = reference.newton_schulz5_gram_polynomial(matrix)
        ours = reference.newton_schulz5(matrix, eps=1e-7, norm_in_dtype=True)
        assert not torch.equal(theirs, ours)
        assert (theirs - ours).norm() < 0.06 * theirs64.norm()


def test_shape_scaled_lr_is_a_fifth_of_the_square_root_of_the_longer_side():
    assert reference.shape_scaled_lr(0.01, (3072, 768)) == pytest.approx(0.01 * 0.2 * 3072**0.5)
    assert reference.shape_scaled_lr(0.01, (768, 2304)) == pytest.approx(0.01 * 0.2 * 48)


# The optimizers against mars.reference. Their Newton-Schulz runs through mars.newton_schulz.orthogonalise, which
# groups the quintic's products differently from the authors' (see above): in float64 the two agree to ~1e-15,
# so the float32 steps agree to float32 rounding.

CLASS_SHAPES = [(12, 4), (12, 4), (4, 12), (8, 8), (9,), (2, 3, 4), (6, 5)]
EMBEDDING = len(CLASS_SHAPES) - 1  # 2-D, in a group with matrix_rule=False: AdamW, as the authors' embeddings


def new_optimizer(variant, params, **options):
    """The optimizer for ``variant`` over ``params``; the last tensor in a group that takes AdamW only."""
    kind = variant["kind"]
    hyper = dict(lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY, ns_steps=NS_STEPS, adamw_betas=ADAMW_BETAS,
                 adamw_eps=ADAMW_EPS)
    hyper.update(options)
    groups = [{"params": params[:-1]}, {"params": params[-1:], "matrix_rule": False}]
    if kind == "mars-m":
        return MarsM(groups, gamma=GAMMA, clip_c=variant["clip_c"], is_approx=variant["is_approx"], **hyper)
    if kind == "efficient":
        return MarsMEfficient(groups, gamma=GAMMA, **hyper)
    return Moonlight(groups, nesterov=variant["nesterov"], **hyper)


def set_grads(params, grads):
    for param, grad in zip(params, grads):
        param.grad = None if grad is None else grad.clone()


def optimizer_step(optimizer, params, grads, lookahead_grads):
    """One iteration of the trainer's protocol: the look-ahead stash first when the optimizer needs it."""
    if getattr(optimizer, "needs_lookahead_grad", False):
        set_grads(params, lookahead_grads)
        optimizer.stash_lookahead_grad()
        optimizer.zero_grad()
    set_grads(params, grads)
    optimizer.step()
    optimizer.zero_grad()


def run_optimizer(variant, initial, steps, **options):
    params = [torch.nn.Parameter(p.clone()) for p in initial]
    optimizer = new_optimizer(variant, params, **options)
    for grads, lookahead_grads, lr in steps:
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer_step(optimizer, params, grads, lookahead_grads)
    return optimizer, params


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", VARIANTS)
def test_optimizer_follows_the_reference(name, dtype, foreach):
    initial, steps = random_steps(CLASS_SHAPES, 8, dtype, seed=200 + len(name))
    optimizer, params = run_optimizer(VARIANTS[name], initial, steps, ns_dtype=torch.float64, foreach=foreach)
    matrix_rule = [len(shape) == 2 and i != EMBEDDING for i, shape in enumerate(CLASS_SHAPES)]
    expected = reference_trajectory(VARIANTS[name], initial, steps, torch.float64, matrix_rule=matrix_rule)
    # bfloat16: a float32 rounding difference can flip the stored bfloat16 value by one ulp.
    tolerance = dict(rtol=1e-6, atol=1e-7) if dtype == torch.float32 else dict(rtol=2 * 2**-8, atol=1e-3)
    for param, e in zip(params, expected):
        assert param.dtype == dtype
        torch.testing.assert_close(param.detach(), e, **tolerance)
    for state in optimizer.state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if torch.is_tensor(v))


@pytest.mark.parametrize("name", ["approx", "efficient", "moonlight"])
def test_bfloat16_newton_schulz_is_the_authors_in_their_product_order(name):
    # One step from zero state: the update is NS(d_1) with d_1 a multiple of g_1 (plus gamma g_1 for efficient).
    torch.manual_seed(3)
    param, grad = torch.nn.Parameter(torch.randn(12, 4)), torch.randn(12, 4) * 0.1
    p0 = param.detach().clone()
    optimizer = new_optimizer(VARIANTS[name], [param, torch.nn.Parameter(torch.zeros(2, 2))])
    direction = {"approx": lambda g: reference.mars_m_momentum(g, torch.zeros_like(g), torch.zeros_like(g),
                                                               momentum=MOMENTUM, gamma=GAMMA, clip_c=True),
                 "efficient": lambda g: reference.mars_m_efficient_direction(g, torch.zeros_like(g),
                                                                             momentum=MOMENTUM, gamma=GAMMA),
                 "moonlight": lambda g: reference.moonlight_direction(g, torch.zeros_like(g), momentum=MOMENTUM,
                                                                      nesterov=True)}[name](grad)
    param.grad = grad.clone()
    optimizer.step()
    for newton_schulz, tolerance in ((reference.newton_schulz5_gram_polynomial, 0.0),
                                     (lambda d: reference.newton_schulz5(d, eps=1e-7, norm_in_dtype=True), 1e-3)):
        expected = p0.clone()
        reference.apply_shape_scaled_update(expected, newton_schulz(direction), lr=LR, weight_decay=WEIGHT_DECAY)
        torch.testing.assert_close(param.detach(), expected, rtol=0, atol=tolerance)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("name", VARIANTS)
def test_optimizer_is_the_reference_bit_for_bit_with_bfloat16_newton_schulz(name, foreach):
    initial, steps = random_steps(CLASS_SHAPES, 6, torch.float32, seed=300 + len(name))
    _, params = run_optimizer(VARIANTS[name], initial, steps, ns_dtype=torch.bfloat16, foreach=foreach)
    matrix_rule = [len(shape) == 2 and i != EMBEDDING for i, shape in enumerate(CLASS_SHAPES)]
    expected = reference_trajectory(VARIANTS[name], initial, steps, torch.bfloat16, matrix_rule=matrix_rule)
    for param, e in zip(params, expected):
        torch.testing.assert_close(param.detach(), e, rtol=0, atol=0)


@pytest.mark.parametrize("name", VARIANTS)
def test_ns_form_orders_the_products_of_the_same_newton_schulz(name):
    # float64: any order is the reference; bfloat16: the order shows, and fused_gram is not the authors' gram.
    initial, steps = random_steps(CLASS_SHAPES, 4, torch.float32, seed=400 + len(name))
    matrix_rule = [len(shape) == 2 and i != EMBEDDING for i, shape in enumerate(CLASS_SHAPES)]
    expected = reference_trajectory(VARIANTS[name], initial, steps, torch.float64, matrix_rule=matrix_rule)
    _, params = run_optimizer(VARIANTS[name], initial, steps, ns_dtype=torch.float64, ns_form="fused_gram")
    for param, e in zip(params, expected):
        torch.testing.assert_close(param.detach(), e, rtol=1e-6, atol=1e-7)
    authors = run_optimizer(VARIANTS[name], initial, steps, ns_dtype=torch.bfloat16)[1]
    fused = run_optimizer(VARIANTS[name], initial, steps, ns_dtype=torch.bfloat16, ns_form="fused_gram")[1]
    assert not torch.equal(fused[0], authors[0])


@pytest.mark.parametrize("name", ["approx", "exact", "efficient", "moonlight"])
def test_same_shaped_matrices_stepped_together_match_one_optimizer_each(name):
    variant = VARIANTS[name]
    shapes = [(8, 4), (8, 4), (4, 8), (8, 4), (6, 6), (5,)]
    initial, steps = random_steps(shapes, 4, torch.float32, seed=300 + len(name))
    together = [torch.nn.Parameter(p.clone()) for p in initial]
    alone = [torch.nn.Parameter(p.clone()) for p in initial]
    batched = new_optimizer(variant, together + [torch.nn.Parameter(torch.zeros(1, 1))], ns_dtype=torch.float32)
    singles = [new_optimizer(variant, [p, torch.nn.Parameter(torch.zeros(1, 1))], ns_dtype=torch.float32)
               for p in alone]
    for grads, lookahead_grads, _ in steps:
        optimizer_step(batched, together, grads, lookahead_grads)
        for single, param, grad, lookahead_grad in zip(singles, alone, grads, lookahead_grads):
            optimizer_step(single, [param], [grad], [lookahead_grad])
    for a, b in zip(together, alone):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


def test_efficient_optimizer_steps_as_unclipped_approximate_mars_m_with_one_buffer_per_matrix():
    initial, steps = random_steps([(12, 4), (4, 12), (9,), (3, 3)], 10, torch.float32, seed=4)
    efficient, efficient_params = run_optimizer(VARIANTS["efficient"], initial, steps, ns_dtype=torch.float64)
    _, mars_m_params = run_optimizer(VARIANTS["approx-unclipped"], initial, steps, ns_dtype=torch.float64)
    for a, b in zip(efficient_params, mars_m_params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert set(efficient.state[efficient_params[0]]) == {"momentum_buffer"}


# The foreach path (mars.mars_m_foreach) against the per-tensor one. On the CPU torch runs a foreach op as a loop of
# the per-tensor op, and the foreach functions keep the reference's order of operations: equal bit for bit.

# Tall, wide, square, single-element and one-row matrices (two of a shape), then AdamW's 1-D, one-element,
# scalar and 3-D tensors, and a 2-D tensor in the AdamW group (EMBEDDING, as new_optimizer groups the last).
FOREACH_SHAPES = [(12, 4), (12, 4), (4, 12), (8, 8), (1, 1), (1, 7), (9,), (1,), (), (2, 3, 4), (6, 5)]


def with_missing_grads(steps):
    """The steps with one tensor's gradient missing at each (a different one each step), and another tensor's
    look-ahead gradient: that tensor keeps an older remembered gradient in the exact scheme."""
    missing = []
    for t, (grads, lookahead_grads, lr) in enumerate(steps):
        grads, lookahead_grads = list(grads), list(lookahead_grads)
        grads[t % len(grads)] = None
        lookahead_grads[(t + 3) % len(grads)] = None
        missing.append((grads, lookahead_grads, lr))
    return missing


def assert_same_params_and_state(optimizer, params, other_optimizer, other_params):
    for param, other in zip(params, other_params):
        assert torch.equal(param.detach(), other.detach())
        state, other_state = optimizer.state[param], other_optimizer.state[other]
        assert state.keys() == other_state.keys()
        for key, value in state.items():
            assert torch.equal(value, other_state[key]) if torch.is_tensor(value) else value == other_state[key]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", VARIANTS)
def test_foreach_path_steps_as_the_per_tensor_path_bit_for_bit(name, dtype):
    initial, steps = random_steps(FOREACH_SHAPES, 7, dtype, seed=500 + len(name))
    steps = with_missing_grads(steps)
    per_tensor, per_tensor_params = run_optimizer(VARIANTS[name], initial, steps, ns_dtype=torch.float32,
                                                  foreach=False)
    foreach, foreach_params = run_optimizer(VARIANTS[name], initial, steps, ns_dtype=torch.float32, foreach=True)
    if dtype == torch.float32:  # (a bfloat16 tensor can round back to where it was)
        assert all(not torch.equal(p.detach(), q) for p, q in zip(foreach_params, initial))  # every tensor moved
    assert_same_params_and_state(foreach, foreach_params, per_tensor, per_tensor_params)


@pytest.mark.parametrize("remember_grad", [True, False])
def test_foreach_clip_divides_exactly_the_corrected_gradients_the_reference_divides(remember_grad):
    # c_t = g when g_prev = g: a one-hot g has norm exactly 1 (not divided), zeros have norm 0.
    generator = torch.Generator().manual_seed(9)
    one_hot = torch.zeros(4, 3)
    one_hot[1, 2] = 1.0
    cases = [(one_hot, one_hot), (torch.zeros(5, 2), torch.zeros(5, 2)),
             (torch.randn(6, 6, generator=generator), torch.randn(6, 6, generator=generator)),  # norm > 1
             (torch.randn(3, 7, generator=generator) * 1e-3, torch.randn(3, 7, generator=generator) * 1e-3)]
    hyper = dict(momentum=MOMENTUM, gamma=GAMMA, clip_c=True)
    expected = [reference.mars_m_momentum(g, last.clone(), torch.full_like(g, 0.5), **hyper) for g, last in cases]
    grads = [g for g, _ in cases]
    last_grads = [last.clone() for _, last in cases]
    momenta = mars_m_foreach.mars_m_momenta(grads, last_grads, [torch.full_like(g, 0.5) for g in grads],
                                            remember_grad=remember_grad, **hyper)
    assert all(torch.equal(m, e) for m, e in zip(momenta, expected))
    remembered = grads if remember_grad else [last for _, last in cases]
    assert all(torch.equal(last, r) for last, r in zip(last_grads, remembered))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("saved_by_foreach, loaded_by_foreach", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("name", ["approx", "exact", "efficient", "moonlight"])
def test_state_dict_round_trip_keeps_float32_state_and_steps_identically_on_either_path(
        name, saved_by_foreach, loaded_by_foreach, dtype):
    variant = VARIANTS[name]
    initial, steps = random_steps(FOREACH_SHAPES, 5, dtype, seed=400 + len(name))
    params = [torch.nn.Parameter(p.clone()) for p in initial]
    optimizer = new_optimizer(variant, params, ns_dtype=torch.float32, foreach=saved_by_foreach)
    for grads, lookahead_grads, _ in steps[:3]:
        optimizer_step(optimizer, params, grads, lookahead_grads)
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = new_optimizer(variant, resumed_params, ns_dtype=torch.float32, foreach=loaded_by_foreach)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.foreach is loaded_by_foreach
    for state in resumed.state.values():
        assert all(v.dtype == torch.float32 for v in state.values() if torch.is_tensor(v))
    for grads, lookahead_grads, _ in steps[3:]:
        optimizer_step(optimizer, params, grads, lookahead_grads)
        optimizer_step(resumed, resumed_params, grads, lookahead_grads)
    assert_same_params_and_state(optimizer, params, resumed, resumed_params)


def count_calls(monkeypatch, module, functions) -> list:
    """A list that gets an entry each time one of ``module``'s ``functions`` is called (they still run)."""
    calls = []
    for function in functions:
        original = getattr(module, function)
        monkeypatch.setattr(module, function,
                            lambda *args, original=original, **kwargs: calls.append(1) or original(*args, **kwargs))
    return calls


@pytest.mark.parametrize("foreach, path_taken", [(True, True), (False, False), (None, True)])
def test_foreach_option_chooses_the_path(foreach, path_taken, monkeypatch):
    calls = count_calls(monkeypatch, mars_m_foreach,
                        ("mars_m_momenta", "apply_shape_scaled_updates", "mars_m_adamw_steps"))
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))]
    optimizer = MarsM(params, ns_dtype=torch.float32, foreach=foreach)
    set_grads(params, [torch.randn(4, 3), torch.randn(3)])
    optimizer.step()
    assert len(calls) == (3 if path_taken else 0)


def test_tensors_routed_to_adamw_take_the_authors_adamw_with_the_group_lr_and_weight_decay():
    # Step 1: p (1 - lr wd) - lr sqrt(1 - b2) / (1 - b1) (1 - b1) g / (sqrt(1 - b2) |g| + eps).
    vector, embedding, cube = (torch.nn.Parameter(torch.randn(shape)) for shape in [(5,), (4, 3), (2, 2, 2)])
    optimizer = MarsM([{"params": [vector, cube]}, {"params": [embedding], "matrix_rule": False, "lr": 0.01}],
                      lr=0.02, weight_decay=0.1)
    for param, lr in ((vector, 0.02), (embedding, 0.01), (cube, 0.02)):
        p0, grad = param.detach().double().clone(), torch.randn(param.shape) * 1e-3
        param.grad = grad.clone()
        optimizer.step()
        param.grad = None
        g = grad.double()
        expected = p0 * (1 - lr * 0.1) - lr * math.sqrt(0.05) * g / (math.sqrt(0.05) * g.abs() + 1e-8)
        torch.testing.assert_close(param.detach().double(), expected, rtol=1e-5, atol=1e-7)
        assert set(optimizer.state[param]) == {"step", "exp_avg", "exp_avg_sq"}


def test_params_without_grad_are_skipped():
    stepped, idle = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4, 4))
    before = idle.detach().clone()
    optimizer = Moonlight([stepped, idle])
    stepped.grad = torch.randn(4, 4)
    optimizer.step()
    assert torch.equal(idle.detach(), before) and idle not in optimizer.state


def test_a_pickled_exact_mars_m_keeps_its_scheme_and_steps_identically():
    initial, steps = random_steps([(6, 3), (4,)], 3, torch.float32, seed=5)
    params = [torch.nn.Parameter(p.clone()) for p in initial]
    optimizer = MarsM(params, is_approx=False, ns_dtype=torch.float32, foreach=False)
    for grads, lookahead_grads, _ in steps[:2]:
        optimizer_step(optimizer, params, grads, lookahead_grads)
    restored = pickle.loads(pickle.dumps(optimizer))
    assert restored.needs_lookahead_grad and restored.process_group is None and restored.foreach is False
    restored_params = restored.param_groups[0]["params"]
    grads, lookahead_grads, _ = steps[2]
    optimizer_step(optimizer, params, grads, lookahead_grads)
    optimizer_step(restored, restored_params, grads, lookahead_grads)
    for a, b in zip(params, restored_params):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_needs_lookahead_grad_only_in_the_exact_scheme():
    param = [torch.nn.Parameter(torch.zeros(2, 2))]
    assert MarsM(param, is_approx=False).needs_lookahead_grad
    assert not MarsM(param, is_approx=True).needs_lookahead_grad
    assert not getattr(MarsMEfficient(param), "needs_lookahead_grad", False)
    assert not getattr(Moonlight(param), "needs_lookahead_grad", False)


def test_exact_scheme_step_without_stash_raises_and_changes_nothing():
    param = torch.nn.Parameter(torch.randn(3, 2))
    optimizer = MarsM([param], is_approx=False)
    param.grad = torch.ones(3, 2)
    with pytest.raises(RuntimeError, match="stash_lookahead_grad"):
        optimizer.step()
    optimizer.stash_lookahead_grad()
    optimizer.step()
    before = param.detach().clone()
    with pytest.raises(RuntimeError, match="stash_lookahead_grad"):
        optimizer.step()  # each step needs its own stash
    assert torch.equal(param.detach(), before)


def test_exact_scheme_stashes_only_matrices_and_the_authors_call_sequence_agrees():
    initial, steps = random_steps([(6, 3), (4,), (3, 3)], 4, torch.float32, seed=6)
    runs = []
    for sequence in ("clean", "authors"):
        params = [torch.nn.Parameter(p.clone()) for p in initial]
        optimizer = MarsM([{"params": params[:2]}, {"params": params[2:], "matrix_rule": False}], is_approx=False,
                          ns_dtype=torch.float32)
        for grads, lookahead_grads, _ in steps:
            if sequence == "clean":
                optimizer_step(optimizer, params, grads, lookahead_grads)
                continue
            set_grads(params, lookahead_grads)  # train_mars_m.py:354-384, 410-414
            optimizer.update_previous_grad()
            optimizer.zero_grad(set_to_none=True)
            set_grads(params, grads)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            optimizer.update_last_grad()
        assert [set(optimizer.state[p]) for p in params] == [
            {"momentum_buffer", "last_grad", "previous_grad"}, {"step", "exp_avg", "exp_avg_sq"},
            {"step", "exp_avg", "exp_avg_sq"}]
        runs.append(params)
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["approx", "exact", "efficient", "moonlight"])
def test_optimizer_reduces_the_loss_of_a_small_regression(name):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    inputs = torch.randn(256, 8)
    targets = inputs @ torch.randn(8, 1)
    params = list(model.parameters())
    optimizer = new_optimizer(VARIANTS[name], params, lr=0.01, weight_decay=0.0, ns_dtype=torch.float32)

    def gradients(batch):
        rows = slice(32 * (batch % 8), 32 * (batch % 8 + 1))
        model.zero_grad()
        torch.nn.functional.mse_loss(model(inputs[rows]), targets[rows]).backward()
        return [p.grad.clone() for p in params]

    def loss():
        with torch.no_grad():
            return torch.nn.functional.mse_loss(model(inputs), targets).item()

    initial = loss()
    exact = getattr(optimizer, "needs_lookahead_grad", False)
    for batch in range(60):
        # Exact scheme: the next batch's gradient at the current parameters, before this batch's.
        lookahead_grads = gradients(batch + 1) if exact else [None] * len(params)
        optimizer_step(optimizer, params, gradients(batch), lookahead_grads)
    assert loss() < 0.3 * initial


@pytest.mark.parametrize("name", ["approx", "moonlight"])
def test_two_ranks_sharing_newton_schulz_step_bit_for_bit_as_one_process(name, start_group, monkeypatch):
    # Two ranks simulated in one process, as tests/mars/test_newton_schulz.py does: each orthogonalises its share,
    # and the all-reduce of the (bfloat16) buffers hands both every update.
    variant, group = VARIANTS[name], start_group()
    initial, steps = random_steps([(12, 4), (12, 4), (4, 12), (8, 8), (5,)], 1, torch.float32, seed=8)
    grads, lookahead_grads, _ = steps[0]

    def one_step(process_group):
        params = [torch.nn.Parameter(p.clone()) for p in initial]
        optimizer = new_optimizer(variant, params + [torch.nn.Parameter(torch.zeros(1, 1))],
                                  process_group=process_group)
        optimizer_step(optimizer, params, grads, lookahead_grads)
        return [p.detach() for p in params]

    alone = one_step(None)
    ranks, buffers = run_on_simulated_ranks(monkeypatch, 2, lambda: one_step(group))
    assert [b.dtype for b in buffers] == [torch.bfloat16] * 2 and all(b.count_nonzero() > 0 for b in buffers)
    for params in ranks:
        for a, b in zip(params, alone):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_process_group_is_held_weakly(start_group):
    group = start_group()
    optimizer = MarsM([torch.nn.Parameter(torch.randn(4, 3))], process_group=group)
    assert optimizer.process_group is group
    del group
    dist.destroy_process_group()
    with pytest.raises(RuntimeError, match="process group of this MarsM was destroyed"):
        optimizer.process_group


@pytest.mark.parametrize("optimizer_class", [MarsM, MarsMEfficient, Moonlight])
@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(lr=-1e-3), "lr"),
        (dict(momentum=1.0), "momentum"),
        (dict(momentum=-0.1), "momentum"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(ns_steps=0), "ns_steps"),
        (dict(ns_steps=2.5), "ns_steps"),
        (dict(adamw_betas=(0.9, 1.0)), "adamw_betas"),
        (dict(adamw_betas=(0.9,)), "adamw_betas"),
        (dict(adamw_eps=-1e-8), "adamw_eps"),
        (dict(matrix_rule="yes"), "matrix_rule"),
        (dict(ns_dtype=torch.float16), "ns_dtype"),
        (dict(foreach="yes"), "foreach"),
        (dict(ns_form="fused"), "ns_form"),
    ],
)
def test_invalid_argument_raises_value_error_naming_it(optimizer_class, kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        optimizer_class([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


@pytest.mark.parametrize(
    "optimizer_class, kwargs, argument",
    [
        (MarsM, dict(gamma=-0.1), "gamma"),
        (MarsM, dict(clip_c=None), "clip_c"),
        (MarsM, dict(is_approx=0), "is_approx"),
        (MarsMEfficient, dict(gamma=-0.1), "gamma"),
        (MarsMEfficient, dict(momentum=0.0), "momentum"),
        (Moonlight, dict(nesterov="true"), "nesterov"),
    ],
)
def test_invalid_variant_argument_raises_value_error_naming_it(optimizer_class, kwargs, argument):
    with pytest.raises(ValueError, match=rf"^{argument} must"):
        optimizer_class([torch.nn.Parameter(torch.zeros(2, 2))], **kwargs)


def test_invalid_param_group_override_raises_value_error_naming_it():
    with pytest.raises(ValueError, match="^weight_decay must"):
        MarsM([{"params": [torch.nn.Parameter(torch.zeros(2, 2))], "weight_decay": -1.0}])


@pytest.mark.parametrize("optimizer_class", [MarsM, MarsMEfficient, Moonlight])
def test_complex_params_and_sparse_gradients_are_rejected(optimizer_class):
    with pytest.raises(ValueError, match="complex"):
        optimizer_class([torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.complex64))])
    param = torch.nn.Parameter(torch.zeros(3, 3))
    param.grad = torch.eye(3).to_sparse()
    with pytest.raises(RuntimeError, match="sparse"):
        optimizer_class([param]).step()
