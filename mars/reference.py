"""MARS update rules, written once and plainly: the ground truth that every fast path is tested against.

Paper: "MARS: Unleashing the Power of Variance Reduction for Training Large Models" (arXiv 2411.10438).
The formulas follow the authors' implementation (AGI-Arena/MARS, ``MARS/optimizers/mars.py``, ``update_fn``),
including its order of floating-point operations, with two deliberate differences that do not change the
math for float32 parameters:

* optimizer state is float32 for bfloat16/float16/float32 parameters (float64 for float64 ones), and the update
  is computed in the state's dtype (:func:`working_dtype`);
* the remembered gradient is a copy, never an alias of ``p.grad`` (the official approximate scheme keeps a
  reference, which silently breaks under ``zero_grad(set_to_none=False)`` and DDP gradient buckets).

For a tensor with gradient g_t and remembered gradient g_prev (zeros before the first step):

    c_t = g_t + gamma * beta1 / (1 - beta1) * (g_t - g_prev)
    c_t = c_t / ||c_t||_2                          if ||c_t||_2 > 1
    m_t = beta1 * m + (1 - beta1) * c_t

    mars-adamw:   v_t = beta2 * v + (1 - beta2) * c_t^2                (amsgrad: v_max = max(v_max, v_t))
                  update = m_t / ((sqrt(v_t) / sqrt(1 - beta2^t) + eps) * (1 - beta1^t))
    mars-lion:    update = sign(m_t)
    mars-shampoo: update = NS5(m_t / (1 - beta1)) * sqrt(max(1, rows / cols))      (2-D tensors)

    p <- p - lr * (update + weight_decay * p)

Tensors that are not 2-D take a plain AdamW step on g_t instead (unless ``optimize_1d``), with
``betas_1d``, learning rate ``lr_1d`` and weight decay ``weight_decay_1d``.
"""
import math

import torch
from torch import Tensor

from mars.step_count import bias_correction, square_root

MARS_TYPES = ("mars-adamw", "mars-lion", "mars-shampoo")
NEWTON_SCHULZ_COEFFS = (3.4445, -4.7750, 2.0315)


def working_dtype(tensor: Tensor) -> torch.dtype:
    """The dtype state and updates of ``tensor`` are computed in: float32, or float64 for a float64 tensor."""
    return torch.promote_types(tensor.dtype, torch.float32)


def uses_mars_rule(param: Tensor, optimize_1d: bool) -> bool:
    """Whether ``param`` takes the MARS update (2-D tensors, or every tensor with ``optimize_1d``)."""
    return optimize_1d or param.dim() == 2


def corrected_gradient(grad: Tensor, last_grad: Tensor, gamma: float, beta1: float) -> Tensor:
    """The variance-reduced gradient c_t, clipped to unit L2 norm when its norm exceeds 1, in ``last_grad``'s
    (the state's) dtype."""
    grad = grad.to(last_grad.dtype)
    c_t = (grad - last_grad).mul(gamma * (beta1 / (1.0 - beta1))).add(grad)
    # The official `if norm > 1: c_t = c_t / norm`, as a division by max(norm, 1): the same numbers (a division by 1
    # is exact) without reading the norm on the host, so a compiled step keeps one graph.
    return c_t / torch.linalg.vector_norm(c_t).clamp_min(1.0)


def adam_denominator(exp_avg_sq: Tensor, step: int, beta1: float, beta2: float, eps: float) -> Tensor:
    """(sqrt(v) / sqrt(1 - beta2^t) + eps) * (1 - beta1^t): Adam's bias corrections folded into one divisor."""
    return (exp_avg_sq.sqrt().mul(1 / square_root(bias_correction(beta2, step))).add(eps)
            .mul(bias_correction(beta1, step)))


def normalised_wide(matrix: Tensor, eps: float, dtype: torch.dtype, norm_in_dtype: bool) -> tuple[Tensor, bool]:
    """The ``dtype`` copy of ``matrix`` (or of each matrix of a batch) divided by its norm plus ``eps``, transposed
    to be at least as wide as tall, and whether it was transposed. The norm is the ``dtype`` copy's own with
    ``norm_in_dtype``, else ``matrix``'s (see :func:`newton_schulz5`)."""
    x = matrix.to(dtype)
    normed = x if norm_in_dtype else matrix
    norm = normed.norm() if matrix.dim() == 2 else normed.norm(dim=(-2, -1), keepdim=True)
    # A 0-dim norm leaves x's dtype alone, a batch's (batch x 1 x 1) would promote x to the norm's: rounding the
    # quotient back to ``dtype`` makes each matrix of a batch the one it is alone (bit for bit on the CPU, where
    # the 0-dim divisor is applied in float32 as well).
    x = (x / (norm + eps)).to(dtype)
    transposed = matrix.size(-2) > matrix.size(-1)
    return (x.mT if transposed else x), transposed


def newton_schulz5(matrix: Tensor, steps: int = 5, eps: float = 1e-7, dtype: torch.dtype = torch.bfloat16,
                   norm_in_dtype: bool = False) -> Tensor:
    """Approximate orthogonalisation U V^T of ``matrix`` by a quintic Newton-Schulz iteration in ``dtype``.

    ``matrix`` may be a batch of same-shaped matrices (batch x rows x cols), each normalised by its own norm.
    bfloat16 is what the authors (and Muon's) run on GPUs; CPUs without bfloat16 matrix units run it ~10x slower
    than float32, hence the choice. The ``dtype`` copy of ``matrix`` is divided by the norm of ``matrix``, as
    the authors' MARS-Shampoo does (``MARS/optimizers/mars.py:224``), or with ``norm_in_dtype`` by its own
    norm, taken and divided in ``dtype``, as their Muon does (``MARS/optimizers/muon.py:26-27``). In bfloat16
    the two differ by a rounding of the norm, which the iteration then amplifies: most output elements change.
    """
    a, b, c = NEWTON_SCHULZ_COEFFS
    x, transposed = normalised_wide(matrix, eps, dtype, norm_in_dtype)
    for _ in range(steps):
        gram = x @ x.mT
        gram_x = gram @ x
        x = a * x + b * gram_x + c * gram @ gram_x
    if transposed:
        x = x.mT
    return x.to(matrix.dtype)


def add_scaled_(tensor: Tensor, other: Tensor, scale: float | Tensor) -> Tensor:
    """tensor += scale * other, in place: ``add_``'s alpha for a float scale; a tensor scale (a tensor lr in a traced
    step, :func:`mars.optimizer.step_lr`), which alpha does not take, multiplies first."""
    if torch.is_tensor(scale):
        return tensor.add_(other * scale)
    return tensor.add_(other, alpha=scale)


def apply_update(param: Tensor, update: Tensor, lr: float, weight_decay: float, *,
                 decay_inside_add: bool = False) -> None:
    """p <- p - lr * (update + weight_decay * p), computed in :func:`working_dtype` and written back in p's dtype.

    The official code rounds weight_decay * p before adding the update, except for mars-shampoo's matrices
    (``decay_inside_add``), whose ``update.add(wd, p)`` rounds once (MARS/optimizers/mars.py:38 against :33, :35).
    """
    work = param.to(working_dtype(param))
    if decay_inside_add:
        decayed = update.add(work, alpha=weight_decay)
    else:
        decayed = torch.mul(work, weight_decay).add(update)
    work.add_(decayed.mul(-lr))
    param.copy_(work)


@torch.no_grad()
def mars_step(param: Tensor, grad: Tensor, last_grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor | None,
              max_exp_avg_sq: Tensor | None, *, step: int, lr: float, beta1: float, beta2: float, eps: float,
              weight_decay: float, gamma: float, mars_type: str, amsgrad: bool,
              ns_dtype: torch.dtype = torch.bfloat16) -> None:
    """One MARS update of ``param`` in place; ``last_grad``/``exp_avg``/``exp_avg_sq``/``max_exp_avg_sq`` are state
    in :func:`working_dtype` of ``param``.

    ``exp_avg_sq`` is needed by mars-adamw and by mars-shampoo on tensors that are not 2-D (which fall back to
    the AdamW-style rule, as in the official code); ``max_exp_avg_sq`` only with ``amsgrad``.
    """
    if mars_type not in MARS_TYPES:
        raise ValueError(f"mars_type must be one of {MARS_TYPES}, got {mars_type!r}")
    c_t = corrected_gradient(grad, last_grad, gamma, beta1)
    exp_avg.mul_(beta1).add_(c_t, alpha=1.0 - beta1)
    if mars_type == "mars-adamw" or (mars_type == "mars-shampoo" and param.dim() != 2):
        update = adam_direction(exp_avg, exp_avg_sq, max_exp_avg_sq, c_t, step=step, beta1=beta1, beta2=beta2,
                                eps=eps, amsgrad=amsgrad)
    elif mars_type == "mars-lion":
        update = exp_avg.sign()
    else:
        # The official code passes the optimizer's eps to Newton-Schulz as its normalisation guard.
        scale = max(1.0, param.size(0) / param.size(1)) ** 0.5
        update = newton_schulz5(exp_avg.mul(1.0 / (1.0 - beta1)), eps=eps, dtype=ns_dtype).mul(scale)
    shampoo_matrix = mars_type == "mars-shampoo" and param.dim() == 2
    apply_update(param, update, lr, weight_decay, decay_inside_add=shampoo_matrix)


def adam_direction(exp_avg: Tensor, exp_avg_sq: Tensor, max_exp_avg_sq: Tensor | None, values: Tensor, *,
                   step: int, beta1: float, beta2: float, eps: float, amsgrad: bool) -> Tensor:
    """Adam's update direction m_t / ((sqrt(v_t) / sqrt(1 - beta2^t) + eps) * (1 - beta1^t)) after
    v_t = beta2 v + (1 - beta2) x^2 of ``values`` x (m_t already updated); with ``amsgrad`` v_t's running maximum."""
    exp_avg_sq.mul_(beta2).addcmul_(values, values, value=1.0 - beta2)
    second_moment = exp_avg_sq
    if amsgrad:
        torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second_moment = max_exp_avg_sq
    return exp_avg.div(adam_denominator(second_moment, step, beta1, beta2, eps))


@torch.no_grad()
def adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, max_exp_avg_sq: Tensor | None, *,
               step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
               amsgrad: bool) -> None:
    """The AdamW step MARS applies to tensors that are not 2-D (the official ``update_fn``'s else branch)."""
    grad = grad.to(exp_avg.dtype)
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    update = adam_direction(exp_avg, exp_avg_sq, max_exp_avg_sq, grad, step=step, beta1=beta1, beta2=beta2, eps=eps,
                            amsgrad=amsgrad)
    apply_update(param, update, lr, weight_decay)


@torch.no_grad()
def authors_adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, step: int, lr: float,
                       beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """The AdamW of the MARS authors' baselines (``MARS/optimizers/adamw.py:103-122``), in place:

        m_t = beta1 * m + (1 - beta1) * g_t
        v_t = beta2 * v + (1 - beta2) * g_t^2
        step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
        p <- p - step_size * (weight_decay * p + m_t / (sqrt(v_t) + eps))

    It differs from torch's AdamW (:func:`adamw_step`) twice: eps is added to the uncorrected sqrt(v_t), so it
    weighs 1 / sqrt(1 - beta2^t) times more, and the weight decay is scaled by step_size instead of lr, so it is
    sqrt(1 - beta2^t) / (1 - beta1^t) times stronger (2.2x at step 1 with betas (0.9, 0.95), tending to 1).
    ``exp_avg`` and ``exp_avg_sq`` are state in :func:`working_dtype` of ``param``, the step is computed in it and
    written back in ``param``'s dtype.
    """
    grad = grad.to(exp_avg.dtype)
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    denominator = exp_avg_sq.sqrt().add_(eps)
    step_size = lr * square_root(bias_correction(beta2, step)) / bias_correction(beta1, step)
    work = param.to(working_dtype(param))
    work.add_(torch.mul(work, weight_decay).addcdiv_(exp_avg, denominator).mul_(-step_size))
    param.copy_(work)


# MARS-M and its Moonlight baseline. Paper: "MARS-M: When Variance Reduction Meets Matrices" (arXiv 2510.21800);
# code: AGI-Arena/MARS, ``MARS_M/optimizers/{mars_m,mars_m_efficient,moonlight}.py``. The state buffers are the
# caller's; every rule computes in the buffers' dtype (float32 in the optimizers), and writes parameters in their
# own dtype after updating a float32 copy (float64 parameters are updated in float64).

MOONLIGHT_UPDATE_SCALE = 0.2
MARS_M_NEWTON_SCHULZ_EPS = 1e-7


def shape_scaled_lr(lr: float, shape: torch.Size | tuple[int, ...]) -> float:
    """Moonlight's step size for an A x B matrix: lr * 0.2 * sqrt(max(A, B)).

    It gives the orthogonalised update about the RMS of an AdamW update, so that AdamW's learning rate and weight
    decay carry over (``mars_m.py:102-108``, ``moonlight.py:100-106``, ``mars_m_efficient.py:91-97``; the
    product is formed in their order). Only the step is scaled: weight decay is applied with ``lr`` itself.
    """
    rows, cols = shape[0], shape[1]
    return lr * (MOONLIGHT_UPDATE_SCALE * math.sqrt(max(rows, cols)))


def newton_schulz5_gram_polynomial(matrix: Tensor, steps: int = 5, eps: float = MARS_M_NEWTON_SCHULZ_EPS,
                                   dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """The MARS-M authors' Newton-Schulz (``mars_m.py:4-34``; the same in ``moonlight.py`` and
    ``mars_m_efficient.py``), run eagerly although theirs is ``torch.compile``d.

    Same quintic as :func:`newton_schulz5` (coefficients ``NEWTON_SCHULZ_COEFFS``, ``steps`` iterations, the
    ``dtype`` copy, transposed to be wide, divided by its own norm taken in ``dtype`` plus ``eps``), but
    each iteration forms the polynomial in the Gram matrix A = X X^T first, X <- a X + (b A + c A A) X, where
    :func:`newton_schulz5` computes a X + b (A X) + c A (A X). The two are equal in exact arithmetic and differ by
    rounding: by 2-3% of the result's norm in bfloat16, as much as either differs from float64 and as the
    authors' compiled kernels differ from this eager transcription. A batch of matrices (batch x rows x cols)
    is normalised matrix by matrix (theirs takes one norm over a whole >2-D tensor, which GPT-2 never has).
    """
    a, b, c = NEWTON_SCHULZ_COEFFS
    x = matrix.to(dtype)
    transposed = matrix.size(-2) > matrix.size(-1)
    if transposed:
        x = x.mT
    norm = x.norm() if matrix.dim() == 2 else x.norm(dim=(-2, -1), keepdim=True)
    x = x / (norm + eps)
    for _ in range(steps):
        gram = x @ x.mT
        polynomial = b * gram + c * gram @ gram
        x = a * x + polynomial @ x
    if transposed:
        x = x.mT
    return x.to(matrix.dtype)


def mars_m_momentum(grad: Tensor, last_grad: Tensor, momentum_buffer: Tensor, *, momentum: float, gamma: float,
                    clip_c: bool) -> Tensor:
    """MARS-M's momentum, updated in place and returned: the matrix that Newton-Schulz orthogonalises.

        c_t = g_t + gamma * beta / (1 - beta) * (g_t - g_prev)        (mars_m.py:74,197)
        c_t = c_t / ||c_t||_F  if ||c_t||_F > 1, with clip_c          (mars_m.py:198-200)
        m_t = beta * m + (1 - beta) * c_t                             (mars_m.py:201-202)

    g_prev is the previous step's gradient in the approximate scheme, the stashed look-ahead gradient in the exact
    one (zeros at the first step). The authors' code clips whatever its ``clip_c`` says (the flag is stored and
    never read), so their runs all clipped; ``clip_c=False`` gives the unclipped rule that mars_m_efficient.py
    implements. Unlike MARS-Shampoo, m_t is not divided by 1 - beta before Newton-Schulz (its norm is divided out).
    """
    grad = grad.to(momentum_buffer.dtype)
    c_t = (grad - last_grad.to(momentum_buffer.dtype)).mul(gamma * momentum / (1 - momentum)).add(grad)
    if clip_c:
        c_t.div_(c_t.norm().clamp_min(1.0))  # `if norm > 1: c_t /= norm`, without a host read (corrected_gradient)
    return momentum_buffer.mul_(momentum).add_(c_t, alpha=1 - momentum)


def mars_m_efficient_direction(grad: Tensor, momentum_buffer: Tensor, *, momentum: float, gamma: float) -> Tensor:
    """The memory-efficient MARS-M's matrix to orthogonalise (``mars_m_efficient.py:133-142``); updates
    ``momentum_buffer`` in place:

        b_t = beta * b + (1 - gamma) (1 - beta) / beta * g_t
        d_t = gamma * g_t + beta * b_t

    d_t is exactly the unclipped approximate MARS-M momentum m_t: substituting b = (m - gamma g) / beta into
    m_t = beta m + (1 - beta) g_t + gamma beta (g_t - g_{t-1}) gives the recursion above. One buffer replaces
    MARS-M's two (momentum and previous gradient); there is no clip, no exact scheme, and beta must be > 0.
    """
    grad = grad.to(momentum_buffer.dtype)
    momentum_buffer.mul_(momentum).add_(grad, alpha=(1 - gamma) * (1 - momentum) / momentum)
    return grad.mul(gamma).add(momentum_buffer, alpha=momentum)


def moonlight_direction(grad: Tensor, momentum_buffer: Tensor, *, momentum: float, nesterov: bool) -> Tensor:
    """Moonlight's (Muon's) matrix to orthogonalise (``moonlight.py:144-151``); updates ``momentum_buffer``:

        b_t = beta * b + g_t,    d_t = g_t + beta * b_t (nesterov)  or  d_t = b_t
    """
    grad = grad.to(momentum_buffer.dtype)
    momentum_buffer.mul_(momentum).add_(grad)
    return grad.add(momentum_buffer, alpha=momentum) if nesterov else momentum_buffer


def apply_shape_scaled_update(param: Tensor, update: Tensor, *, lr: float, weight_decay: float) -> None:
    """p <- p (1 - lr * weight_decay) - lr * 0.2 * sqrt(max(A, B)) * O_t, in place (``mars_m.py:207-214``).

    ``update`` is the orthogonalised O_t; the authors add their bfloat16 O_t to the float32 parameter, which is
    what adding it cast to float32 does.
    """
    work = param.to(working_dtype(param))
    add_scaled_(work.mul_(1 - lr * weight_decay), update.to(work.dtype), -shape_scaled_lr(lr, param.shape))
    param.copy_(work)


def step_by_orthogonalised(param: Tensor, direction: Tensor, *, lr: float, weight_decay: float, ns_steps: int,
                           ns_dtype: torch.dtype) -> None:
    """The step MARS-M, its memory-efficient form and Moonlight end with: the authors' Newton-Schulz of
    ``direction`` (:func:`newton_schulz5_gram_polynomial`), applied by :func:`apply_shape_scaled_update`."""
    update = newton_schulz5_gram_polynomial(direction, ns_steps, dtype=ns_dtype)
    apply_shape_scaled_update(param, update, lr=lr, weight_decay=weight_decay)


@torch.no_grad()
def mars_m_step(param: Tensor, grad: Tensor, last_grad: Tensor, momentum_buffer: Tensor, *, lr: float,
                momentum: float, gamma: float, weight_decay: float, clip_c: bool, ns_steps: int = 5,
                ns_dtype: torch.dtype = torch.bfloat16) -> None:
    """One MARS-M step of a matrix (``mars_m.py:182-214``), Algorithm 2 of arXiv 2510.21800:

        m_t = mars_m_momentum(...)
        p <- p (1 - lr * weight_decay) - lr * 0.2 * sqrt(max(A, B)) * NS(m_t)

    with NS the authors' Newton-Schulz (:func:`newton_schulz5_gram_polynomial`, ``ns_steps`` iterations in
    ``ns_dtype``). What ``last_grad`` holds next is the scheme's business: ``grad`` (approximate) or the next
    look-ahead gradient (exact); this function leaves it as it is.
    """
    direction = mars_m_momentum(grad, last_grad, momentum_buffer, momentum=momentum, gamma=gamma, clip_c=clip_c)
    step_by_orthogonalised(param, direction, lr=lr, weight_decay=weight_decay, ns_steps=ns_steps, ns_dtype=ns_dtype)


@torch.no_grad()
def mars_m_efficient_step(param: Tensor, grad: Tensor, momentum_buffer: Tensor, *, lr: float, momentum: float,
                          gamma: float, weight_decay: float, ns_steps: int = 5,
                          ns_dtype: torch.dtype = torch.bfloat16) -> None:
    """One step of the memory-efficient MARS-M on a matrix (``mars_m_efficient.py:124-152``): the approximate,
    unclipped :func:`mars_m_step` with one state buffer (:func:`mars_m_efficient_direction`)."""
    direction = mars_m_efficient_direction(grad, momentum_buffer, momentum=momentum, gamma=gamma)
    step_by_orthogonalised(param, direction, lr=lr, weight_decay=weight_decay, ns_steps=ns_steps, ns_dtype=ns_dtype)


@torch.no_grad()
def moonlight_step(param: Tensor, grad: Tensor, momentum_buffer: Tensor, *, lr: float, momentum: float,
                   nesterov: bool, weight_decay: float, ns_steps: int = 5,
                   ns_dtype: torch.dtype = torch.bfloat16) -> None:
    """One Moonlight step of a matrix (``moonlight.py:133-161``; Muon as arXiv 2502.16982 scales it):

        p <- p (1 - lr * weight_decay) - lr * 0.2 * sqrt(max(A, B)) * NS(d_t),   d_t = moonlight_direction(...)
    """
    direction = moonlight_direction(grad, momentum_buffer, momentum=momentum, nesterov=nesterov)
    step_by_orthogonalised(param, direction, lr=lr, weight_decay=weight_decay, ns_steps=ns_steps, ns_dtype=ns_dtype)


@torch.no_grad()
def mars_m_adamw_step(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, step: int, lr: float,
                      beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """The AdamW that MARS-M and Moonlight apply to the tensors they do not orthogonalise (``mars_m.py:222-250``,
    the same lines in ``moonlight.py:167-195`` and ``mars_m_efficient.py:158-186``):

        m_t = beta1 * m + (1 - beta1) * g_t,   v_t = beta2 * v + (1 - beta2) * g_t^2       (as lerps)
        p <- p (1 - lr * weight_decay) - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m_t / (sqrt(v_t) + eps)

    eps is added to the uncorrected sqrt(v_t), as in :func:`authors_adamw_step`, but the weight decay is torch's
    lr * weight_decay, not scaled by the step size: a third AdamW, neither :func:`adamw_step` nor
    :func:`authors_adamw_step`. ``lr`` and ``weight_decay`` are the matrices' own (the authors give both parts one
    of each).
    """
    grad = grad.to(exp_avg.dtype)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.lerp_(grad.square(), 1 - beta2)
    direction = exp_avg / (eps + exp_avg_sq.sqrt())
    scale = (1 - beta1**step) / (1 - beta2**step) ** 0.5
    work = param.to(working_dtype(param))
    add_scaled_(work.mul_(1 - lr * weight_decay), direction.to(work.dtype), -lr / scale)
    param.copy_(work)
