"""The multi-tensor Triton kernels against mars.reference, tensor by tensor, over several steps.

Without a CUDA device the kernels run on CPU tensors under TRITON_INTERPRET=1 (set in tests/conftest.py).
All state starts random, never zero, every step brings fresh random gradients, and the reference changes every
element every step, so an element the kernels skip shows up as a mismatch.
"""
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

from mars import reference

triton_backend = pytest.importorskip("mars.triton_backend", reason="needs Triton")

pytestmark = pytest.mark.triton_interpreter

DEVICE = torch.device("cpu") if triton_backend.INTERPRETED else torch.device("cuda")
# Sizes that end mid-block (2053 spans three blocks of 1024). The first tensor's gradients are scaled down so
# that its c_t stays under unit norm while the others' exceed it: both branches of the clip.
SHAPES = [(129,), (1,), (7,), (33, 17), (1003,), (2053,)]
SMALL_GRADIENT_SCALE = 1e-3
HYPERPARAMETERS = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
GAMMA = 0.025
NUM_STEPS = 3


@dataclass
class OptimizerTensors:
    """Parameters and their float32 state; lists a configuration does not use are None."""

    params: list[Tensor]
    last_grads: list[Tensor]
    exp_avgs: list[Tensor]
    exp_avg_sqs: list[Tensor] | None
    max_exp_avg_sqs: list[Tensor] | None

    def clone(self) -> "OptimizerTensors":
        def clone_all(tensors):
            return None if tensors is None else [t.clone() for t in tensors]

        return OptimizerTensors(*(clone_all(tensors) for tensors in vars(self).values()))


def random_tensors(shapes, param_dtypes, generator, *, second_moment: bool, amsgrad: bool) -> OptimizerTensors:
    def randn(shape, scale=1.0):
        return (torch.randn(shape, generator=generator) * scale).to(DEVICE)

    def positive(shape):
        return (torch.rand(shape, generator=generator) * 1e-2 + 1e-4).to(DEVICE)

    return OptimizerTensors(
        params=[randn(shape).to(dtype) for shape, dtype in zip(shapes, param_dtypes)],
        last_grads=[randn(shape, SMALL_GRADIENT_SCALE if i == 0 else 1.0) for i, shape in enumerate(shapes)],
        exp_avgs=[randn(shape, 0.1) for shape in shapes],
        exp_avg_sqs=[positive(shape) for shape in shapes] if second_moment else None,
        max_exp_avg_sqs=[positive(shape) for shape in shapes] if amsgrad else None,
    )


def random_grads(shapes, grad_dtypes, generator) -> list[Tensor]:
    return [
        (torch.randn(shape, generator=generator) * (SMALL_GRADIENT_SCALE if i == 0 else 1.0)).to(DEVICE, dtype)
        for i, (shape, dtype) in enumerate(zip(shapes, grad_dtypes))
    ]


def unclipped_corrected_gradient_norms(grads, last_grads) -> list[float]:
    scale = GAMMA * HYPERPARAMETERS["beta1"] / (1.0 - HYPERPARAMETERS["beta1"])
    return [
        torch.linalg.vector_norm(grad.float() + scale * (grad.float() - last_grad)).item()
        for grad, last_grad in zip(grads, last_grads)
    ]


def assert_within_one_ulp(actual: Tensor, expected: Tensor) -> None:
    """Equal up to one unit in the last place of ``expected``'s dtype (bf16/fp16 rounding of the same fp32 value)."""
    magnitude = expected.abs()
    ulp = torch.nextafter(magnitude, torch.full_like(magnitude, float("inf"))).float() - magnitude.float()
    error = (actual.float() - expected.float()).abs()
    assert bool((error <= ulp).all()), f"max error {error.max().item()} exceeds one ulp"


def assert_tensors_match(actual: OptimizerTensors, expected: OptimizerTensors) -> None:
    for name, actual_list in vars(actual).items():
        expected_list = getattr(expected, name)
        if actual_list is None:
            assert expected_list is None
            continue
        for i, (got, want) in enumerate(zip(actual_list, expected_list)):
            assert got.dtype == want.dtype, f"{name}[{i}]"
            if got.dtype == torch.float32:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}[{i}]: {m}")
            else:
                # Both round the same float32 update to the parameter's dtype; the interpreter truncates where
                # the GPU rounds to nearest, and float32 rounding can tip a tie: at most one ulp apart.
                assert_within_one_ulp(got, want)


def share_low_precision_params(actual: OptimizerTensors, expected: OptimizerTensors) -> None:
    """Start the reference's next step from the kernels' bf16/fp16 parameters, so that one-ulp rounding
    differences are checked step by step instead of compounding over the steps."""
    for got, want in zip(actual.params, expected.params):
        if got.dtype != torch.float32:
            want.copy_(got)


def consecutive_steps(first_steps) -> list[list[int]]:
    """The steps of NUM_STEPS calls, each tensor counting up from its first step."""
    return [[first_step + offset for first_step in first_steps] for offset in range(NUM_STEPS)]


def run_mars_steps(shapes, param_dtypes, grad_dtypes, steps_per_call, *, mars_type, amsgrad, remember_grad,
                   before_call=lambda call: None) -> None:
    """Calls of mars_group_step, one per entry of ``steps_per_call``, against per-tensor reference.mars_step,
    compared after every call. ``before_call(call)`` runs before each."""
    generator = torch.Generator().manual_seed(0)
    state = random_tensors(shapes, param_dtypes, generator, second_moment=mars_type == "mars-adamw",
                           amsgrad=amsgrad)
    expected = state.clone()
    # Every call's gradients stay alive, so that each call brings its gradients at new addresses.
    all_grads = []
    for call, steps in enumerate(steps_per_call):
        grads = random_grads(shapes, grad_dtypes, generator)
        all_grads.append(grads)
        grads_before = [grad.clone() for grad in grads]
        norms = unclipped_corrected_gradient_norms(grads, expected.last_grads)
        assert min(norms) < 1.0 < max(norms), "inputs must exercise both branches of the clip"

        before_call(call)
        triton_backend.mars_group_step(
            state.params, grads, state.last_grads, state.exp_avgs, state.exp_avg_sqs, state.max_exp_avg_sqs,
            steps=steps, gamma=GAMMA, mars_type=mars_type, amsgrad=amsgrad, remember_grad=remember_grad,
            **HYPERPARAMETERS,
        )
        for i, (grad, step) in enumerate(zip(grads, steps)):
            reference.mars_step(
                expected.params[i], grad, expected.last_grads[i], expected.exp_avgs[i],
                None if expected.exp_avg_sqs is None else expected.exp_avg_sqs[i],
                None if expected.max_exp_avg_sqs is None else expected.max_exp_avg_sqs[i],
                step=step, gamma=GAMMA, mars_type=mars_type, amsgrad=amsgrad, **HYPERPARAMETERS,
            )
            if remember_grad:
                expected.last_grads[i].copy_(grad)
        assert_tensors_match(state, expected)
        share_low_precision_params(state, expected)
        for grad, grad_before in zip(grads, grads_before):
            assert torch.equal(grad, grad_before), "gradients are read-only"


@pytest.mark.parametrize("remember_grad", [False, True], ids=["keep_last_grad", "remember_grad"])
@pytest.mark.parametrize("mars_type, amsgrad", [("mars-adamw", False), ("mars-adamw", True), ("mars-lion", False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mars_group_step_matches_reference_per_tensor(dtype, mars_type, amsgrad, remember_grad):
    run_mars_steps(SHAPES, [dtype] * len(SHAPES), [dtype] * len(SHAPES), consecutive_steps([1] * len(SHAPES)),
                   mars_type=mars_type, amsgrad=amsgrad, remember_grad=remember_grad)


def test_mixed_dtypes_and_steps_in_one_call_match_reference():
    param_dtypes = [torch.float32, torch.bfloat16, torch.bfloat16, torch.float16, torch.float32, torch.bfloat16]
    grad_dtypes = [torch.float32, torch.bfloat16, torch.float32, torch.float16, torch.float32, torch.float32]
    run_mars_steps(SHAPES, param_dtypes, grad_dtypes, consecutive_steps([4, 4, 1, 4, 2, 1]),
                   mars_type="mars-adamw", amsgrad=True, remember_grad=True)


@pytest.mark.slow
def test_norm_reduction_over_many_blocks_matches_reference(monkeypatch):
    # Small blocks give each tensor many partial sums, and the per-tensor reduction several iterations.
    monkeypatch.setattr(triton_backend, "BLOCK_SIZE", 128)
    monkeypatch.setattr(triton_backend, "REDUCE_BLOCK_SIZE", 4)
    run_mars_steps(SHAPES, [torch.float32] * len(SHAPES), [torch.float32] * len(SHAPES),
                   consecutive_steps([1] * len(SHAPES)), mars_type="mars-adamw", amsgrad=False, remember_grad=True)


def test_aligned_tensors_take_the_vectorised_path_and_match_reference():
    shapes = [(64,), (16,), (48, 32), (2048,)]  # lengths multiples of 16, as in GPT-2
    run_mars_steps(shapes, [torch.bfloat16] * len(shapes), [torch.bfloat16] * len(shapes),
                   consecutive_steps([1] * len(shapes)), mars_type="mars-adamw", amsgrad=False, remember_grad=True)


def test_steps_that_diverge_after_checked_calls_match_reference():
    # Calls with every tensor at one step, then tensors at different steps (a parameter that missed a gradient
    # lags behind): the launch groups, one per step, must follow.
    steps_per_call = [[1] * len(SHAPES), [2] * len(SHAPES), [3, 2, 3, 3, 2, 3]]
    run_mars_steps(SHAPES, [torch.float32] * len(SHAPES), [torch.float32] * len(SHAPES), steps_per_call,
                   mars_type="mars-adamw", amsgrad=False, remember_grad=True)


def test_a_block_size_changed_after_checked_calls_matches_reference(monkeypatch):
    # scripts/bench_triton_kernel.py retunes it between calls on the same tensors.
    def smaller_blocks_from_the_second_call(call):
        if call == 1:
            monkeypatch.setattr(triton_backend, "BLOCK_SIZE", 128)

    run_mars_steps(SHAPES, [torch.float32] * len(SHAPES), [torch.float32] * len(SHAPES),
                   consecutive_steps([1] * len(SHAPES)), mars_type="mars-adamw", amsgrad=False, remember_grad=True,
                   before_call=smaller_blocks_from_the_second_call)


@pytest.mark.parametrize("amsgrad", [False, True], ids=["adam", "amsgrad"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_adamw_group_step_matches_reference_per_tensor(dtype, amsgrad):
    generator = torch.Generator().manual_seed(0)
    state = random_tensors(SHAPES, [dtype] * len(SHAPES), generator, second_moment=True, amsgrad=amsgrad)
    expected = state.clone()
    for step in range(1, NUM_STEPS + 1):
        grads = random_grads(SHAPES, [dtype] * len(SHAPES), generator)
        triton_backend.adamw_group_step(
            state.params, grads, state.exp_avgs, state.exp_avg_sqs, state.max_exp_avg_sqs,
            steps=[step] * len(SHAPES), amsgrad=amsgrad, **HYPERPARAMETERS,
        )
        for i, grad in enumerate(grads):
            reference.adamw_step(
                expected.params[i], grad, expected.exp_avgs[i], expected.exp_avg_sqs[i],
                None if expected.max_exp_avg_sqs is None else expected.max_exp_avg_sqs[i],
                step=step, amsgrad=amsgrad, **HYPERPARAMETERS,
            )
        assert_tensors_match(state, expected)
        share_low_precision_params(state, expected)


def mars_adamw_call(params, grads, last_grads, exp_avgs, exp_avg_sqs, *, mars_type="mars-adamw"):
    triton_backend.mars_group_step(
        params, grads, last_grads, exp_avgs, exp_avg_sqs, None, steps=[1] * len(params), gamma=GAMMA,
        mars_type=mars_type, amsgrad=False, remember_grad=False, **HYPERPARAMETERS,
    )


def test_empty_lists_are_a_no_op():
    mars_adamw_call([], [], [], [], [])


def test_only_zero_element_tensors_are_a_no_op():
    mars_adamw_call(*([torch.empty(0, device=DEVICE)] for _ in range(5)))


def test_zero_element_tensors_among_others_are_skipped():
    shapes = [(129,), (0,), (7,)]
    run_mars_steps(shapes, [torch.float32] * len(shapes), [torch.float32] * len(shapes),
                   consecutive_steps([1] * len(shapes)), mars_type="mars-adamw", amsgrad=False, remember_grad=True)


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch):
    monkeypatch.setattr(triton_backend, "INTERPRETED", False)
    tensors = [[torch.ones(3)] for _ in range(5)]
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        mars_adamw_call(*tensors)


def square(fill=1.0, dtype=torch.float32):
    return torch.full((5, 5), fill, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize(
    "replace, error, match",
    [
        ({"grads": [square().t()]}, ValueError, "grads\\[0\\] is not contiguous"),
        ({"exp_avgs": [square(dtype=torch.bfloat16)]}, TypeError, "exp_avg\\[0\\] has dtype torch.bfloat16"),
        ({"last_grads": [torch.ones(25, device=DEVICE)]}, ValueError, "last_grad\\[0\\] has shape"),
        ({"exp_avg_sqs": None}, ValueError, "exp_avg_sq must have one entry per param"),
        ({"params": [square(dtype=torch.float64)]}, TypeError, "params\\[0\\] has dtype torch.float64"),
        ({"grads": [square(dtype=torch.float16)]}, TypeError, "grads\\[0\\] has dtype torch.float16"),
        ({"mars_type": "mars-shampoo"}, ValueError, "mars_type must be one of"),
    ],
    ids=["non_contiguous", "state_dtype", "state_shape", "missing_state", "param_dtype", "grad_dtype", "shampoo"],
)
def test_bad_inputs_are_refused_before_launch(replace, error, match):
    arguments = {name: [square(0.5)] for name in ("params", "grads", "last_grads", "exp_avgs", "exp_avg_sqs")}
    arguments.update(replace)
    with pytest.raises(error, match=match):
        mars_adamw_call(**arguments)


# The checks run again only when something they read can have changed (triton_backend._checked_launch_groups):
# each test below changes one such thing after calls that passed them.


def checked_arguments():
    """mars_adamw_call's arguments, with which two calls have passed the checks."""
    arguments = {name: [square(0.5)] for name in ("params", "grads", "last_grads", "exp_avgs", "exp_avg_sqs")}
    for _ in range(2):
        mars_adamw_call(**arguments)
    return arguments


def test_a_non_contiguous_grad_after_checked_calls_is_refused():
    arguments = checked_arguments()
    arguments["grads"] = [arguments["grads"][0].t()]  # a new tensor at the same address
    with pytest.raises(ValueError, match="grads\\[0\\] is not contiguous"):
        mars_adamw_call(**arguments)


def test_a_param_transposed_in_place_after_checked_calls_is_refused():
    # Its identity, address and version counter stay the same: only its metadata tells the change apart.
    arguments = checked_arguments()
    param = arguments["params"][0]
    address, version = param.data_ptr(), param._version
    param.data = param.data.t()
    assert (param.data_ptr(), param._version) == (address, version)
    with pytest.raises(ValueError, match="params\\[0\\] is not contiguous"):
        mars_adamw_call(**arguments)


@pytest.mark.parametrize(
    "new_data, error, match",
    [
        (torch.full((25,), 0.5, device=DEVICE), ValueError, "grads\\[0\\] has shape \\(5, 5\\), its param"),
        (square(0.5, dtype=torch.float64), TypeError, "params\\[0\\] has dtype torch.float64"),
    ],
    ids=["other_shape", "other_dtype"],
)
def test_a_param_given_other_data_after_checked_calls_is_checked_again(new_data, error, match):
    arguments = checked_arguments()
    arguments["params"][0].data = new_data
    with pytest.raises(error, match=match):
        mars_adamw_call(**arguments)


def test_a_state_tensor_replaced_at_the_same_address_is_checked_again():
    arguments = checked_arguments()
    arguments["exp_avgs"] = [arguments["exp_avgs"][0].t()]  # a new tensor at the same address
    with pytest.raises(ValueError, match="exp_avg\\[0\\] is not contiguous"):
        mars_adamw_call(**arguments)


def test_a_state_tensor_moved_in_place_is_checked_again():
    arguments = checked_arguments()
    exp_avg = arguments["exp_avgs"][0]
    exp_avg.data = exp_avg.data.to(torch.bfloat16)  # the same tensor at a new address
    with pytest.raises(TypeError, match="exp_avg\\[0\\] has dtype torch.bfloat16"):
        mars_adamw_call(**arguments)
