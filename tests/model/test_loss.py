"""The chunked linear cross-entropy (model/loss.py) against the plain head: loss and gradients, alone and in GPT."""
import pytest
import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from model import loss as loss_module
from model.loss import linear_cross_entropy
from tests.test_train import SMALL, metrics, run_train

TOKENS, WIDTH, VOCAB = 37, 24, 300
# 37 tokens: 5 and 16 do not divide them, 64 exceeds them, 37 is one chunk of exactly all of them.
CHUNK_SIZES = [1, 5, 16, 37, 64]
FLOAT32_RTOL = 1e-6  # relative error (norm of the difference over the norm) allowed in float32
TINY = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=211)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


def head_inputs(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, WIDTH, generator=generator)
    weight = torch.randn(VOCAB, WIDTH, generator=generator) * 0.3
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    return hidden.to(dtype), weight.to(dtype), targets


def head_loss_and_grads(hidden, weight, targets, chunk_size=0, autocast=False):
    """(loss, d hidden, d weight) of the plain head (chunk_size 0) or the chunked one."""
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if chunk_size:
            loss = linear_cross_entropy(hidden, weight, targets, chunk_size)
        else:
            loss = F.cross_entropy(F.linear(hidden, weight).float(), targets)
    loss.backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_float32_loss_and_gradients_equal_the_plain_head(chunk_size):
    plain = head_loss_and_grads(*head_inputs())
    chunked = head_loss_and_grads(*head_inputs(), chunk_size=chunk_size)
    for name, actual, expected in zip(("loss", "d hidden", "d weight"), chunked, plain):
        assert actual.dtype == expected.dtype
        assert relative_error(actual, expected) < FLOAT32_RTOL, name


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_bfloat16_autocast_is_as_accurate_as_the_plain_head(chunk_size):
    # Both heads compute the same bfloat16 logits, so the losses agree to float32 rounding. The gradients' matrix
    # products are rounded to bfloat16 in both (the chunked weight gradient as a float32 sum of per-chunk bfloat16
    # products): measured against the float64 head, the chunked head must be as accurate as the plain one, to
    # within 10% of the plain head's own error (measured: 0.97-1.03x), and differ from it by less than that error.
    exact = head_loss_and_grads(*head_inputs(torch.float64))
    plain = head_loss_and_grads(*head_inputs(), autocast=True)
    chunked = head_loss_and_grads(*head_inputs(), chunk_size=chunk_size, autocast=True)
    assert relative_error(chunked[0], plain[0]) < FLOAT32_RTOL
    for name, actual, expected, reference in zip(("loss", "d hidden", "d weight"), chunked, plain, exact):
        assert actual.dtype == expected.dtype
        plain_error = relative_error(expected, reference)
        assert plain_error > 1e-5, name  # bfloat16 really was used: float32 is ~1e-7 off
        assert 0.9 * plain_error < relative_error(actual, reference) < 1.1 * plain_error, name
        assert relative_error(actual, expected) < plain_error, name


def test_the_gradient_scales_with_the_incoming_gradient():
    hidden, weight, targets = head_inputs()
    hidden.requires_grad_()
    (3.0 * linear_cross_entropy(hidden, weight, targets, 5)).backward()
    _, plain_grad, _ = head_loss_and_grads(hidden.detach(), weight, targets)
    assert relative_error(hidden.grad, 3.0 * plain_grad) < FLOAT32_RTOL


def test_without_gradients_only_the_loss_is_computed(monkeypatch):
    calls = []
    original = loss_module.chunked_loss_and_grads

    def recording(*args):
        calls.append(args[-2:])
        return original(*args)

    monkeypatch.setattr(loss_module, "chunked_loss_and_grads", recording)
    hidden, weight, targets = head_inputs()
    expected = F.cross_entropy(F.linear(hidden, weight), targets)
    with torch.no_grad():
        loss = linear_cross_entropy(hidden.requires_grad_(), weight.requires_grad_(), targets, 5)
    assert loss.grad_fn is None and relative_error(loss, expected) < FLOAT32_RTOL
    assert calls == [(False, False)]  # neither gradient computed
    linear_cross_entropy(hidden.detach(), weight, targets, 5).backward()
    assert calls[-1] == (False, True)  # only the one that is asked for


def test_a_chunk_size_below_one_or_targets_that_do_not_fit_are_refused():
    hidden, weight, targets = head_inputs()
    with pytest.raises(ValueError, match="chunk_size must be a positive"):
        linear_cross_entropy(hidden, weight, targets, 0)
    with pytest.raises(ValueError, match="one target per token"):
        linear_cross_entropy(hidden, weight, targets[:-1], 5)


def gpt_loss_and_grads(idx, targets, loss_chunk_size, autocast=False, dtype=torch.float32, compiled=False):
    """(loss, {parameter name: gradient}) of the tiny GPT, the same initial weights for every call."""
    torch.manual_seed(0)
    model = GPT(TINY).to(dtype)
    model.loss_chunk_size = loss_chunk_size
    forward = torch.compile(model) if compiled else model
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits, loss = forward(idx, targets)
    assert (logits is None) == (loss_chunk_size > 0)  # no logits on the chunked path
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def token_batch(batch, seq):
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, TINY.vocab_size, (2, batch, seq), generator=generator)


@pytest.mark.parametrize("batch, seq, chunk_size", [(3, 13, 7), (3, 13, 39), (3, 13, 100), (1, 1, 4)])
def test_gpt_float32_loss_and_every_gradient_equal_the_plain_head(batch, seq, chunk_size):
    idx, targets = token_batch(batch, seq)
    plain_loss, plain_grads = gpt_loss_and_grads(idx, targets, 0)
    loss, grads = gpt_loss_and_grads(idx, targets, chunk_size)
    assert relative_error(loss, plain_loss) < FLOAT32_RTOL
    # The head's weight is the token embedding's: its gradient holds both uses.
    assert grads.keys() == plain_grads.keys() and "transformer.wte.weight" in grads
    for name, grad in grads.items():
        assert relative_error(grad, plain_grads[name]) < FLOAT32_RTOL, name


def test_gpt_bfloat16_autocast_gradients_are_as_accurate_as_the_plain_head():
    idx, targets = token_batch(3, 13)
    exact_loss, exact_grads = gpt_loss_and_grads(idx, targets, 0, dtype=torch.float64)
    plain_loss, plain_grads = gpt_loss_and_grads(idx, targets, 0, autocast=True)
    loss, grads = gpt_loss_and_grads(idx, targets, 7, autocast=True)
    assert relative_error(loss, plain_loss) < FLOAT32_RTOL  # the same bfloat16 logits
    for name, grad in grads.items():
        plain_error = relative_error(plain_grads[name], exact_grads[name])
        assert 0.9 * plain_error < relative_error(grad, exact_grads[name]) < 1.1 * plain_error, name
        assert relative_error(grad, plain_grads[name]) < plain_error, name


def test_gpt_evaluation_without_gradients_gives_the_plain_loss():
    idx, targets = token_batch(3, 13)
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    with torch.no_grad():
        _, plain = model(idx, targets)
        model.loss_chunk_size = 7
        logits, chunked = model(idx, targets)
        full_logits, no_loss = model(idx)
    assert logits is None and chunked.grad_fn is None
    assert relative_error(chunked, plain) < FLOAT32_RTOL
    assert full_logits.shape == (3, 13, TINY.vocab_size) and no_loss is None  # no targets: the logits as ever


@pytest.mark.slow
def test_compiled_gpt_gives_the_eager_loss_and_gradients():
    idx, targets = token_batch(2, 8)
    eager_loss, eager_grads = gpt_loss_and_grads(idx, targets, 5)
    loss, grads = gpt_loss_and_grads(idx, targets, 5, compiled=True)
    assert relative_error(loss, eager_loss) < FLOAT32_RTOL
    for name, grad in grads.items():
        assert relative_error(grad, eager_grads[name]) < FLOAT32_RTOL, name


@pytest.mark.slow
def test_training_with_the_chunked_loss_follows_the_plain_run(tmp_path):
    run = (*SMALL, "train.max_iters=4", "train.eval_interval=2")
    run_train(tmp_path / "plain", *run)
    # 2 x 32 tokens per batch: chunks of 20, 20, 20 and 4.
    chunked_run = run_train(tmp_path / "chunked", *run, "train.loss_chunk_size=20")
    assert "computed 20 tokens at a time" in chunked_run.stdout + chunked_run.stderr
    plain, chunked = metrics(tmp_path / "plain"), metrics(tmp_path / "chunked")
    assert [r["step"] for r in chunked] == [r["step"] for r in plain]
    for key in ("train/loss", "val/loss", "grad_norm"):  # measured: at most 1e-7 apart
        expected = [r[key] for r in plain if key in r]
        assert expected and [r[key] for r in chunked if key in r] == pytest.approx(expected, rel=1e-6), key


def padded_targets(targets: torch.Tensor, every: int = 3) -> torch.Tensor:
    """``targets`` with every ``every``-th one (and the last five, a row's padding) ignored."""
    padded = targets.clone()
    padded[::every] = loss_module.IGNORED_TARGET
    padded[-5:] = loss_module.IGNORED_TARGET
    return padded


@pytest.mark.parametrize("chunk_size", CHUNK_SIZES)
def test_ignored_targets_are_left_out_of_the_mean_and_its_gradients_as_cross_entropy_leaves_them(chunk_size):
    hidden, weight, targets = head_inputs()
    targets = padded_targets(targets)
    plain = head_loss_and_grads(hidden, weight, targets)
    chunked = head_loss_and_grads(hidden, weight, targets, chunk_size=chunk_size)
    for name, actual, expected in zip(("loss", "d hidden", "d weight"), chunked, plain):
        assert relative_error(actual, expected) < FLOAT32_RTOL, name
    # the mean over the scored targets alone: the same as the head on those tokens only
    scored = targets != loss_module.IGNORED_TARGET
    alone = head_loss_and_grads(hidden[scored], weight, targets[scored], chunk_size=chunk_size)
    assert relative_error(chunked[0], alone[0]) < FLOAT32_RTOL
    assert torch.all(chunked[1][~scored] == 0)


def test_a_batch_without_ignored_targets_gives_the_numbers_of_the_head_before_ignoring_existed():
    # The head before IGNORED_TARGET divided by the Python int n_tokens: the same numbers to the bit.
    def before(hidden, weight, targets, chunk_size):
        n_tokens, weight_c = hidden.size(0), weight
        loss = torch.zeros(())
        grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight)
        for start in range(0, n_tokens, chunk_size):
            chunk, targets_chunk = hidden[start:start + chunk_size], targets[start:start + chunk_size]
            logits = F.linear(chunk, weight_c).float()
            log_normaliser = torch.logsumexp(logits, dim=-1)
            loss += (log_normaliser - logits.gather(1, targets_chunk.unsqueeze(1)).squeeze(1)).sum()
            grad_logits = logits.sub_(log_normaliser.unsqueeze(1)).exp_()
            grad_logits[torch.arange(len(targets_chunk)), targets_chunk] -= 1.0
            grad_logits = grad_logits.mul_(1.0 / n_tokens)
            grad_hidden[start:start + chunk_size] = grad_logits @ weight_c
            grad_weight += grad_logits.t() @ chunk
        return loss / n_tokens, grad_hidden, grad_weight

    hidden, weight, targets = head_inputs()
    for chunk_size in CHUNK_SIZES:
        now = loss_module.chunked_loss_and_grads(hidden, weight, targets, chunk_size, torch.float32, True, True)
        for name, actual, expected in zip(("loss", "d hidden", "d weight"), now, before(hidden, weight, targets,
                                                                                          chunk_size)):
            assert torch.equal(actual, expected), (chunk_size, name)


def test_a_batch_with_every_target_ignored_has_loss_zero_and_no_gradient():
    hidden, weight, targets = head_inputs()
    loss, grad_hidden, grad_weight = head_loss_and_grads(
        hidden, weight, torch.full_like(targets, loss_module.IGNORED_TARGET), chunk_size=16)
    assert loss.item() == 0.0 and not grad_hidden.any() and not grad_weight.any()
