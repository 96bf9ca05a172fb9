"""GPT-2 in plain PyTorch, nanoGPT-style: pre-LayerNorm blocks, GELU MLP, tied embeddings, flash attention."""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.flops import training_flops_per_token
from model.loss import linear_cross_entropy

ACTIVATIONS = {"gelu": "none", "gelu_tanh": "tanh"}  # name -> nn.GELU's `approximate`


@dataclass
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 1024
    vocab_size: int = 50304  # GPT-2's 50,257 padded to a multiple of 64 for faster matmuls
    bias: bool = False  # biases in Linear and LayerNorm; GPT-2 had them, no-bias trains a bit better
    dropout: float = 0.0
    # Divide layer i's attention scores by i + 1 as well (GPT-2's Mistral-style stabiliser; the MARS authors'
    # trainer turns it on for every run).
    scale_attn_by_inverse_layer_idx: bool = False
    # The MLP's GELU: "gelu" (exact, erf) or "gelu_tanh" (the tanh approximation of GPT-2, nanoGPT's new_gelu and
    # the MARS authors' model, AGI-Arena/MARS MARS/model.py:20-25).
    activation: str = "gelu"

    def __post_init__(self):
        for key in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head ({self.n_head}) must divide n_embd ({self.n_embd})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}")

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count from the config alone (no allocation); tied lm_head counted once.

        With ``non_embedding`` the position embedding is left out, as in nanoGPT and the FLOPs formula.
        """
        d, layers, b = self.n_embd, self.n_layer, int(self.bias)
        layer_norm = d + b * d
        attention = d * 3 * d + b * 3 * d + d * d + b * d
        mlp = d * 4 * d + b * 4 * d + 4 * d * d + b * d
        per_layer = 2 * layer_norm + attention + mlp
        total = self.vocab_size * d + self.block_size * d + layers * per_layer + layer_norm
        return total - self.block_size * d if non_embedding else total

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward), PaLM appendix B: 6N + 12 L H Q T."""
        return training_flops_per_token(self.num_params(), self.n_layer, self.n_embd, seq_len or self.block_size)


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (torch's takes bias=False only since 2.1; this keeps init explicit)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout
        head_dim = config.n_embd // config.n_head
        layer_scale = layer_idx + 1 if config.scale_attn_by_inverse_layer_idx else 1
        self.score_scale = 1.0 / (math.sqrt(head_dim) * layer_scale)

    def forward(self, x):
        batch, seq, channels = x.size()
        q, k, v = self.c_attn(x).split(channels, dim=2)
        q, k, v = (t.view(batch, seq, self.n_head, channels // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True, scale=self.score_scale
        )
        y = y.transpose(1, 2).contiguous().view(batch, seq, channels)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=ACTIVATIONS[config.activation])
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer_idx: int):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=LayerNorm(config.n_embd, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # Tokens per chunk of the head's chunked cross-entropy (model/loss.py) when forward gets targets; 0: the
        # plain head. A setting of the run (train.loss_chunk_size), not of the model: checkpoints do not record it.
        self.loss_chunk_size = 0
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer): two residual additions per block.
        for name, param in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        """(logits, loss) of token ids ``idx`` (batch, seq); ``loss`` is the mean cross-entropy against ``targets``.

        Without ``targets`` the loss is None. With ``targets`` and ``loss_chunk_size`` > 0 the logits are never
        materialised (``linear_cross_entropy``) and the first element is None: callers that need logits call
        without targets.
        """
        seq = idx.size(1)
        if seq > self.config.block_size:
            raise ValueError(f"sequence of length {seq} exceeds the model's block_size {self.config.block_size}")
        pos = torch.arange(seq, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None and self.loss_chunk_size:
            return None, linear_cross_entropy(x, self.lm_head.weight, targets, self.loss_chunk_size)
        logits = self.lm_head(x)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss
