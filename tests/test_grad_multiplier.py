"""train.grad_multiplier: the optimizer receives k times the mean gradient of the global batch, however the batch
is split into micro-batches (and ranks: tests/training/test_distributed.py), as the MARS authors' loop does."""
import pytest
import torch

from model import GPT, GPTConfig
from train import accumulate_gradients, clip_gradients
from training.runtime import set_tf32
from tests.test_train import SMALL, metrics, run_train


class FixedBatches:
    """Micro-batch ``micro_step`` of a fixed global batch, as TokenBatches serves one rank's share."""

    device = torch.device("cpu")

    def __init__(self, tokens: torch.Tensor, grad_accum_steps: int):
        self.micro_batches = tokens.chunk(grad_accum_steps)

    def batch(self, step, micro_step):
        chunk = self.micro_batches[micro_step]
        return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def gradients_after(model, batches, grad_accum_steps, grad_multiplier):
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, batches, 0, grad_accum_steps, torch.autocast("cpu", enabled=False), grad_multiplier)
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("grad_accum_steps", [1, 2, 4])
@pytest.mark.parametrize("grad_multiplier", [1.0, 4.0, 12.0])
def test_optimizer_receives_k_times_the_mean_gradient_whatever_the_accumulation(grad_accum_steps, grad_multiplier):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    tokens = torch.randint(0, 64, (8, 9))
    mean = gradients_after(model, FixedBatches(tokens, 1), 1, 1.0)  # one forward over the whole batch: the mean
    scaled = gradients_after(model, FixedBatches(tokens, grad_accum_steps), grad_accum_steps, grad_multiplier)
    for name, grad in mean.items():  # float32 rounding, which scales with the multiplier
        torch.testing.assert_close(scaled[name], grad_multiplier * grad, rtol=1e-5, atol=grad_multiplier * 1e-7)


def test_clip_norm_reports_the_multiplied_gradient():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    batches = FixedBatches(torch.randint(0, 64, (4, 9)), 2)
    gradients_after(model, batches, 2, 1.0)
    norm = clip_gradients(model, 0.0).item()
    gradients_after(model, batches, 2, 4.0)
    assert clip_gradients(model, 0.0).item() == pytest.approx(4 * norm, rel=1e-5)


@pytest.mark.slow
def test_multiplied_gradients_are_clipped_and_the_clipped_fraction_is_logged(tmp_path):
    run = (*SMALL, "train.max_iters=4", "train.eval_interval=4", "train.grad_clip=1.0")
    run_train(tmp_path / "mean", *run)
    run_train(tmp_path / "x1000", *run, "train.grad_multiplier=1000")
    mean, scaled = ([r for r in metrics(tmp_path / name) if "grad_norm" in r] for name in ("mean", "x1000"))
    assert scaled[0]["grad_norm"] == pytest.approx(1000 * mean[0]["grad_norm"], rel=1e-4)  # the same first step
    assert [r["clipped"] for r in scaled] == [1.0] * 4
    assert [r["clipped"] for r in mean] == [float(r["grad_norm"] > 1.0) for r in mean]


def test_tf32_switch_sets_both_of_torchs_flags():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        set_tf32(True)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (True, True)
        set_tf32(False)
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
