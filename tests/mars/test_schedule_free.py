"""Schedule-free SGD (mars/schedule_free.py) against the paper's update, transcribed here: its steps, the average it
is evaluated at, its refusals, and the lr it is not linear in."""
import pytest
import torch

from mars import ScheduleFreeSGD
from mars.traits import trait

SHAPES = [(5, 3), (3,)]
STEPS = 5


def new_params(seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=generator)) for shape in SHAPES]


def gradients(step):
    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def paper_steps(params, lr, beta, weight_decay, steps):
    """Defazio et al. 2024, Algorithm 1 with SGD, uniform average: (y, x) after ``steps`` steps, in float32."""
    y = [param.detach().clone() for param in params]
    z, x = [p.clone() for p in y], [p.clone() for p in y]
    for t in range(1, steps + 1):
        for i, grad in enumerate(gradients(t - 1)):
            z[i] = z[i] - lr * (grad + weight_decay * y[i]) if weight_decay else z[i] - lr * grad
            x[i] = torch.lerp(x[i], z[i], 1.0 / t)  # (1 - c) x + c z, c = 1 / t
            y[i] = torch.lerp(z[i], x[i], beta)  # (1 - beta) z + beta x
    return y, x


def run(optimizer, params, steps):
    for step in range(steps):
        for param, grad in zip(params, gradients(step)):
            param.grad = grad
        optimizer.step()


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_steps_and_average_are_the_papers_bit_for_bit(weight_decay):
    params = new_params()
    expected_y, expected_x = paper_steps(params, 0.05, 0.9, weight_decay, STEPS)
    optimizer = ScheduleFreeSGD(params, lr=0.05, momentum=0.9, weight_decay=weight_decay)
    run(optimizer, params, STEPS)
    for param, y, x in zip(params, expected_y, expected_x):
        assert torch.equal(param.detach(), y)
        assert torch.equal(optimizer.state[param]["x"], x)


def test_it_is_evaluated_at_its_average_and_trains_on_from_its_weights_bit_for_bit():
    params = new_params()
    optimizer = ScheduleFreeSGD(params, lr=0.05)
    run(optimizer, params, STEPS)
    training = [param.detach().clone() for param in params]
    optimizer.eval()
    optimizer.eval()  # twice: still the average, the training weights kept once
    assert all(torch.equal(param, optimizer.state[param]["x"]) for param in params)
    optimizer.train()
    optimizer.train()
    assert all(torch.equal(param, weights) for param, weights in zip(params, training))
    assert all("y" not in optimizer.state[param] for param in params)


def test_its_updates_are_not_linear_in_lr_as_its_trait_says():
    # At lr 0 the base sequence stays, but the average moves towards it, and the parameters with it.
    params = new_params()
    optimizer = ScheduleFreeSGD(params, lr=0.05)
    run(optimizer, params, 2)
    optimizer.param_groups[0]["lr"] = 0.0
    before = [param.detach().clone() for param in params]
    run(optimizer, params, 1)
    assert any(not torch.equal(param, old) for param, old in zip(params, before))
    assert trait(ScheduleFreeSGD, "UPDATES_LINEAR_IN_LR") is False


@pytest.mark.parametrize("arguments, message", [
    (dict(momentum=1.0), r"^momentum must be in \[0, 1\), got 1.0"),
    (dict(momentum=-0.1), r"^momentum must be in \[0, 1\), got -0.1"),
    (dict(weight_decay=-1.0), "^weight_decay must be >= 0, got -1.0"),
    (dict(lr=-1.0), "lr"),
])
def test_a_bad_hyperparameter_is_refused_naming_it(arguments, message):
    with pytest.raises(ValueError, match=message):
        ScheduleFreeSGD(new_params(), **arguments)
