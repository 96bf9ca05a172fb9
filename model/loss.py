"""The language-model head and its cross-entropy, chunked over tokens so that the full logits never exist.

The plain head, ``F.cross_entropy(lm_head(hidden).float(), targets)``, holds the logits of every token of a
micro-batch: for GPT-2 small at 16 x 1024 tokens, 1.6 GB in bfloat16 plus 3.3 GB in float32. Here the tokens are
taken ``chunk_size`` at a time, and the forward pass of each chunk also computes its gradients (Liger-Kernel's
fused linear cross-entropy, in plain PyTorch): a chunk's logits live only while it is processed, and the
backward pass only scales the stored gradients by the incoming one, with no recomputation.

Each chunk follows the plain path's arithmetic: the logits in the compute dtype (the autocast dtype, as
``nn.Linear`` under autocast, otherwise the input's), upcast to float32 for the loss and for the gradient
w.r.t. the logits, softmax - onehot, which is cast back to the compute dtype before the two matrix products, as
autograd casts it. The weight's gradient is accumulated over the chunks in float32. From the forward pass to the
backward pass the gradients are held instead of the logits: hidden's (tokens x C) and the weight's in float32
(V x C, 154 MB for GPT-2 small). Nothing is distributed here: under DDP the weight's gradient reaches its .grad
and is all-reduced like any other.
"""
import torch
import torch.nn.functional as F

# A target the loss skips (F.cross_entropy's default): the padding of a corpus of rows (C4, data/c4.py).
IGNORED_TARGET = -100


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_size: int) -> torch.Tensor:
    """Mean cross-entropy of the logits ``hidden @ weight.T`` against ``targets``, ``chunk_size`` tokens at a time.

    ``hidden`` is (..., C), ``weight`` (V, C), ``targets`` the token ids (...,); a target ``IGNORED_TARGET`` is left
    out of the mean, as ``F.cross_entropy`` leaves it (a micro-batch with none to score has loss 0). Equals
    ``F.cross_entropy(F.linear(hidden, weight).float().view(-1, V), targets.view(-1))`` up to float rounding, and
    so do its gradients, which reach ``weight.grad`` (an embedding
    tied to the weight adds its own). Without gradient mode, or when neither input requires a gradient, only the
    loss is computed.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive number of tokens, got {chunk_size}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"targets of shape {tuple(targets.shape)} do not fit hidden states of shape "
                         f"{tuple(hidden.shape)}: one target per token expected")
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        compute_dtype = torch.get_autocast_dtype(device_type)
    else:
        compute_dtype = hidden.dtype
    hidden_2d, targets_1d = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return LinearCrossEntropy.apply(hidden_2d, weight, targets_1d, chunk_size, compute_dtype)
    return chunked_loss_and_grads(hidden_2d, weight, targets_1d, chunk_size, compute_dtype, False, False)[0]


class LinearCrossEntropy(torch.autograd.Function):
    """Loss and gradients in the forward pass; the backward pass scales the gradients by the incoming one."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, compute_dtype):
        loss, grad_hidden, grad_weight = chunked_loss_and_grads(
            hidden, weight, targets, chunk_size, compute_dtype, ctx.needs_input_grad[0], ctx.needs_input_grad[1])
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_loss.to(grad_hidden.dtype)
        if grad_weight is not None:
            grad_weight = grad_weight * grad_loss
        return grad_hidden, grad_weight, None, None, None


def chunked_loss_and_grads(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_size: int,
                           compute_dtype: torch.dtype, grad_of_hidden: bool, grad_of_weight: bool):
    """(mean loss, d loss / d hidden or None, d loss / d weight or None) of 2-D ``hidden`` and 1-D ``targets``."""
    # The casts below to compute_dtype, not an enclosing autocast, decide the precision of every product.
    with torch.autocast(hidden.device.type, enabled=False):
        return _chunked_loss_and_grads(hidden, weight, targets, chunk_size, compute_dtype, grad_of_hidden,
                                       grad_of_weight)


def _chunked_loss_and_grads(hidden, weight, targets, chunk_size, compute_dtype, grad_of_hidden, grad_of_weight):
    n_tokens = hidden.size(0)
    scored = targets != IGNORED_TARGET
    # The mean's divisor as a tensor, no host read; 1 / n in float64 first, as a Python float divisor was, so that
    # a batch without ignored targets gives the numbers it gave before ignoring existed.
    n_scored = scored.sum().clamp(min=1)
    inverse_n = (1.0 / n_scored.double()).float()
    targets = torch.where(scored, targets, 0)  # any real class for gather; masked out below
    weight_c = weight.to(compute_dtype)  # once for all chunks, as autocast casts it once for the whole batch
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if grad_of_hidden else None
    grad_weight = torch.zeros_like(weight, dtype=torch.float32) if grad_of_weight else None
    for start in range(0, n_tokens, chunk_size):
        hidden_chunk = hidden[start:start + chunk_size].to(compute_dtype)
        targets_chunk, scored_chunk = targets[start:start + chunk_size], scored[start:start + chunk_size]
        logits = F.linear(hidden_chunk, weight_c).float()
        log_normaliser = torch.logsumexp(logits, dim=-1)
        target_logits = logits.gather(1, targets_chunk.unsqueeze(1)).squeeze(1)
        loss += torch.where(scored_chunk, log_normaliser - target_logits, 0.0).sum()
        if not (grad_of_hidden or grad_of_weight):
            continue
        # d mean / d logits = (softmax - onehot) / n_scored (0 for an ignored target), in float32, then in the
        # compute dtype as autograd hands it to the matrix products. In place: the float32 logits are not needed
        # any more.
        grad_logits = logits.sub_(log_normaliser.unsqueeze(1)).exp_()
        grad_logits[torch.arange(len(targets_chunk), device=hidden.device), targets_chunk] -= 1.0
        grad_logits = grad_logits.mul_(torch.where(scored_chunk, inverse_n, 0.0).unsqueeze(1)).to(compute_dtype)
        if grad_of_hidden:
            grad_hidden[start:start + chunk_size] = grad_logits @ weight_c
        if grad_of_weight:
            grad_weight += (grad_logits.t() @ hidden_chunk).float()
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    return loss / n_scored, grad_hidden, grad_weight
