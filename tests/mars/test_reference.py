"""mars.reference against the update rules written out by hand in float64."""
import pytest
import torch

from mars import reference

LR, BETA1, BETA2, EPS, WD, GAMMA = 0.01, 0.95, 0.99, 1e-8, 0.1, 0.025
CORRECTION_SCALE = GAMMA * BETA1 / (1 - BETA1)


def zeros_state(param):
    return {key: torch.zeros_like(param) for key in ("last_grad", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")}


def mars_step(param, grad, state, step, mars_type, amsgrad=False, weight_decay=WD):
    reference.mars_step(
        param, grad, state["last_grad"], state["exp_avg"], state["exp_avg_sq"], state["max_exp_avg_sq"],
        step=step, lr=LR, beta1=BETA1, beta2=BETA2, eps=EPS, weight_decay=weight_decay, gamma=GAMMA,
        mars_type=mars_type, amsgrad=amsgrad,
    )


def clipped(c):
    """The clip rule in float64: scale to unit norm only when the norm exceeds 1."""
    norm = c.norm()
    return c / norm if norm > 1 else c


def test_first_mars_adamw_step_with_zero_last_grad_is_sign_like_step():
    # At step 1, m / bc1 = c and sqrt(v / bc2) = |c|, so the update is c / (|c| + eps).
    torch.manual_seed(0)
    param, grad = torch.randn(4, 3), torch.randn(4, 3) * 0.01
    expected_c = (1 + CORRECTION_SCALE) * grad.double()
    expected = param.double() - LR * (expected_c / (expected_c.abs() + EPS) + WD * param.double())
    mars_step(param, grad, zeros_state(param), step=1, mars_type="mars-adamw")
    torch.testing.assert_close(param.double(), expected, rtol=1e-6, atol=1e-7)


def test_second_mars_adamw_step_corrects_with_the_previous_gradient():
    torch.manual_seed(1)
    param, grad1, grad2 = torch.randn(3, 5), torch.randn(3, 5) * 0.02, torch.randn(3, 5) * 0.02
    state = zeros_state(param)
    p0 = param.double().clone()
    mars_step(param, grad1, state, step=1, mars_type="mars-adamw")
    state["last_grad"].copy_(grad1)
    mars_step(param, grad2, state, step=2, mars_type="mars-adamw")

    g1, g2 = grad1.double(), grad2.double()
    c1 = clipped((1 + CORRECTION_SCALE) * g1)
    c2 = clipped(g2 + CORRECTION_SCALE * (g2 - g1))
    m1, v1 = (1 - BETA1) * c1, (1 - BETA2) * c1**2
    m2, v2 = BETA1 * m1 + (1 - BETA1) * c2, BETA2 * v1 + (1 - BETA2) * c2**2
    p1 = p0 - LR * (m1 / (1 - BETA1) / ((v1 / (1 - BETA2)).sqrt() + EPS) + WD * p0)
    p2 = p1 - LR * (m2 / (1 - BETA1**2) / ((v2 / (1 - BETA2**2)).sqrt() + EPS) + WD * p1)
    torch.testing.assert_close(state["exp_avg"].double(), m2, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(param.double(), p2, rtol=1e-6, atol=1e-7)


def test_corrected_gradient_is_clipped_to_unit_norm_when_its_norm_exceeds_one():
    torch.manual_seed(2)
    grad, last_grad = torch.randn(6, 4) * 3, torch.randn(6, 4)
    raw = grad.double() + CORRECTION_SCALE * (grad.double() - last_grad.double())
    assert raw.norm() > 1
    c_t = reference.corrected_gradient(grad, last_grad, GAMMA, BETA1)
    torch.testing.assert_close(c_t.norm().item(), 1.0, rtol=1e-6, atol=0)
    torch.testing.assert_close(c_t.double(), raw / raw.norm(), rtol=1e-6, atol=1e-8)


def test_corrected_gradient_is_left_alone_when_its_norm_is_at_most_one():
    torch.manual_seed(3)
    grad, last_grad = torch.randn(6, 4) * 0.01, torch.randn(6, 4) * 0.01
    raw = grad.double() + CORRECTION_SCALE * (grad.double() - last_grad.double())
    assert raw.norm() < 1
    c_t = reference.corrected_gradient(grad, last_grad, GAMMA, BETA1)
    torch.testing.assert_close(c_t.double(), raw, rtol=1e-6, atol=1e-9)


def test_amsgrad_divides_by_the_running_maximum_of_the_second_moment():
    # The second gradient makes c_2 = g_2 + s * (g_2 - g_1) almost zero: v shrinks at step 2, its maximum does not.
    param = torch.zeros(2, 2)
    grad1 = torch.tensor([[0.4, -0.2], [0.1, 0.3]])
    grad2 = grad1 * (CORRECTION_SCALE / (1 + CORRECTION_SCALE)) + 1e-3
    state = zeros_state(param)
    mars_step(param, grad1, state, step=1, mars_type="mars-adamw", amsgrad=True, weight_decay=0.0)
    state["last_grad"].copy_(grad1)
    p1 = param.double().clone()
    mars_step(param, grad2, state, step=2, mars_type="mars-adamw", amsgrad=True, weight_decay=0.0)

    c1 = clipped((1 + CORRECTION_SCALE) * grad1.double())
    c2 = clipped(grad2.double() + CORRECTION_SCALE * (grad2.double() - grad1.double()))
    v1, v2 = (1 - BETA2) * c1**2, BETA2 * (1 - BETA2) * c1**2 + (1 - BETA2) * c2**2
    v_max = torch.maximum(v1, v2)
    assert (v_max > v2).all()
    m2 = BETA1 * (1 - BETA1) * c1 + (1 - BETA1) * c2
    expected = p1 - LR * m2 / (1 - BETA1**2) / ((v_max / (1 - BETA2**2)).sqrt() + EPS)
    torch.testing.assert_close(state["max_exp_avg_sq"].double(), v_max, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(param.double(), expected, rtol=1e-6, atol=1e-8)


def test_mars_lion_steps_by_the_sign_of_the_momentum():
    torch.manual_seed(4)
    param, grad = torch.randn(5, 3), torch.randn(5, 3)
    expected = param.double() - LR * (torch.sign(grad.double()) + WD * param.double())
    mars_step(param, grad, zeros_state(param), step=1, mars_type="mars-lion")
    torch.testing.assert_close(param.double(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(12, 4), (4, 12)])
def test_mars_shampoo_steps_by_the_orthogonalised_momentum_scaled_by_shape(shape):
    torch.manual_seed(5)
    param, grad = torch.randn(shape), torch.randn(shape) * 0.01
    p0 = param.clone()
    mars_step(param, grad, zeros_state(param), step=1, mars_type="mars-shampoo")
    # Step 1: m / (1 - beta1) is c_t itself.
    c_t = reference.corrected_gradient(grad, torch.zeros_like(grad), GAMMA, BETA1)
    scale = max(1.0, shape[0] / shape[1]) ** 0.5
    expected = p0 - LR * (reference.newton_schulz5(c_t, eps=EPS) * scale + WD * p0)
    torch.testing.assert_close(param, expected, rtol=1e-5, atol=1e-6)


def test_mars_shampoo_rounds_its_step_in_the_official_order():
    # MARS/optimizers/mars.py:38 adds the decay inside one add, NS(m).mul(factor).add(wd, p).mul(-lr), where
    # mars-adamw and mars-lion round wd * p first (:33, :35): a last-bit difference the reference must not make.
    torch.manual_seed(7)
    param, grad = torch.randn(64, 48), torch.randn(64, 48) * 0.01
    p0 = param.clone()
    mars_step(param, grad, zeros_state(param), step=1, mars_type="mars-shampoo")
    c_t = reference.corrected_gradient(grad, torch.zeros_like(grad), GAMMA, BETA1)
    momentum = torch.zeros_like(c_t).add(c_t, alpha=1.0 - BETA1)
    update = reference.newton_schulz5(momentum.mul(1.0 / (1.0 - BETA1)), eps=EPS).mul(max(1.0, 64 / 48) ** 0.5)
    official = p0.add(update.add(p0, alpha=WD).mul(-LR))
    decay_rounded_first = p0.add(torch.mul(p0, WD).add(update).mul(-LR))
    assert torch.equal(param, official)
    # The data tells the two orders apart where add(x, alpha=a) fuses a * x into the addition (torch's vectorised
    # CPU kernels); its scalar kernels (ATEN_CPU_CAPABILITY=default) round a * x first, the two orders alike.
    fused = torch.backends.cpu.get_cpu_capability() != "DEFAULT"
    assert torch.equal(official, decay_rounded_first) is not fused


def test_mars_shampoo_takes_the_adamw_style_rule_on_tensors_that_are_not_2d():
    torch.manual_seed(6)
    shampoo_param, grad = torch.randn(7), torch.randn(7) * 0.01
    adamw_param = shampoo_param.clone()
    mars_step(shampoo_param, grad, zeros_state(shampoo_param), step=1, mars_type="mars-shampoo")
    mars_step(adamw_param, grad, zeros_state(adamw_param), step=1, mars_type="mars-adamw")
    torch.testing.assert_close(shampoo_param, adamw_param, rtol=0, atol=0)


def test_adamw_step_matches_adamw_written_out():
    torch.manual_seed(7)
    param, grad1, grad2 = torch.randn(9), torch.randn(9), torch.randn(9)
    exp_avg, exp_avg_sq = torch.zeros(9), torch.zeros(9)
    p0 = param.double().clone()
    beta1, beta2, lr, wd = 0.9, 0.95, 0.003, 0.1
    for step, grad in enumerate((grad1, grad2), start=1):
        reference.adamw_step(param, grad, exp_avg, exp_avg_sq, None, step=step, lr=lr, beta1=beta1,
                             beta2=beta2, eps=EPS, weight_decay=wd, amsgrad=False)
    g1, g2 = grad1.double(), grad2.double()
    m1, v1 = (1 - beta1) * g1, (1 - beta2) * g1**2
    m2, v2 = beta1 * m1 + (1 - beta1) * g2, beta2 * v1 + (1 - beta2) * g2**2
    p1 = p0 - lr * (m1 / (1 - beta1) / ((v1 / (1 - beta2)).sqrt() + EPS) + wd * p0)
    p2 = p1 - lr * (m2 / (1 - beta1**2) / ((v2 / (1 - beta2**2)).sqrt() + EPS) + wd * p1)
    torch.testing.assert_close(param.double(), p2, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("shape", [(16, 16), (32, 8), (8, 32)])
def test_newton_schulz_output_is_near_orthogonal(shape):
    torch.manual_seed(8)
    matrix = torch.randn(shape)
    orthogonalised = reference.newton_schulz5(matrix)
    # Five quintic steps push every singular value into roughly [0.7, 1.2], not exactly to 1.
    singular_values = torch.linalg.svdvals(orthogonalised.double())
    assert singular_values.min() > 0.6 and singular_values.max() < 1.3
    # It approximates U V^T of the input, the nearest semi-orthogonal matrix.
    u, _, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    cosine = torch.nn.functional.cosine_similarity(orthogonalised.double().flatten(), (u @ vh).flatten(), dim=0)
    assert cosine > 0.97
    assert orthogonalised.dtype == matrix.dtype and orthogonalised.shape == matrix.shape


@pytest.mark.parametrize("shape", [(16, 16), (48, 8)])
def test_newton_schulz_in_float32_tracks_float64_where_bfloat16_rounds(shape):
    torch.manual_seed(9)
    matrix = torch.randn(shape)
    exact = reference.newton_schulz5(matrix.double(), dtype=torch.float64)
    float32_error = (reference.newton_schulz5(matrix, dtype=torch.float32).double() - exact).abs().max()
    bfloat16_error = (reference.newton_schulz5(matrix).double() - exact).abs().max()
    assert float32_error < 1e-5
    assert bfloat16_error > 100 * float32_error  # the default really iterates in bfloat16


@pytest.mark.parametrize("shape", [(4, 12, 12), (3, 20, 6), (2, 5, 9)])
def test_a_batch_of_matrices_is_orthogonalised_each_by_its_own_norm(shape):
    torch.manual_seed(10)
    batch = torch.randn(shape) * torch.tensor([1.0, 30.0, 0.01, 5.0])[: shape[0], None, None]
    together = reference.newton_schulz5(batch, dtype=torch.float32)
    for matrix, result in zip(batch, together):
        torch.testing.assert_close(result, reference.newton_schulz5(matrix, dtype=torch.float32),
                                   rtol=1e-5, atol=1e-6)


def test_uses_mars_rule_for_2d_tensors_or_everything_with_optimize_1d():
    assert reference.uses_mars_rule(torch.zeros(3, 4), optimize_1d=False)
    assert not reference.uses_mars_rule(torch.zeros(3), optimize_1d=False)
    assert not reference.uses_mars_rule(torch.zeros(2, 3, 4), optimize_1d=False)
    assert reference.uses_mars_rule(torch.zeros(3), optimize_1d=True)
