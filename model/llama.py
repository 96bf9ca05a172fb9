"""A LLaMA-style decoder as the optimizer literature trains it on C4 (GaLore and the papers after it): pre-RMSNorm
blocks, rotary position embeddings, a SwiGLU MLP, no biases, untied input and output embeddings.

Where each choice comes from (jiaweizzhao/GaLore, ``peft_pretraining/modeling_llama.py``, the model their
``torchrun_main.py:26,202`` trains; sizes in configs/model/llama-*.yaml, traced to their ``configs/llama_*.json``):
RMSNorm with its weight at one and eps 1e-6 (``modeling_llama.py:74-91``, ``llama_*.json:16``); rotary embeddings
of base 10000 that rotate the two halves of each head (``:94-141``); SiLU-gated MLP ``down(silu(gate(x)) * up(x))``
(``:144-158``, ``hidden_act`` ``llama_*.json:7``); separate q, k, v, o projections without bias and causal SDPA at
1/sqrt(head_dim) (``:177-224``); a final RMSNorm and an ``lm_head`` of its own (``:438``, ``:608``: their configs do
not set ``tie_word_embeddings``, whose default is false); every Linear and Embedding drawn N(0, 0.02)
(``initializer_range``, ``llama_*.json:10``; ``modeling_llama.py:339-348``), with no depth scaling.

Parameter names follow transformers' ``LlamaForCausalLM`` without its ``model.`` prefix, so the export to it
(evaluation/export_hf.py) renames nothing else. One difference from GaLore's model: their embedding's
``padding_idx`` is ``pad_token_id`` = -1 (``:433-436``, ``llama_*.json:15``), which keeps the last row of the table
at zero and out of training; our trainer scores every token, so no row is held back.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.flops import training_flops_per_token
from model.loss import linear_cross_entropy

INIT_STD = 0.02  # GaLore configs/llama_*.json:10, initializer_range


@dataclass
class LlamaConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    intermediate_size: int = 2048  # the SwiGLU's inner width: GaLore sets it per size (llama_*.json:9)
    block_size: int = 1024  # the longest sequence: the rotary table's length (no parameters depend on it)
    vocab_size: int = 50304  # GPT-2's, padded, as the embedded corpus needs; GaLore's t5-base runs: 32000
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_embeddings: bool = False  # GaLore's LLaMA keeps lm_head apart from the token embedding

    def __post_init__(self):
        for key in ("n_layer", "n_head", "n_embd", "intermediate_size", "block_size", "vocab_size"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ValueError(f"n_head ({self.n_head}) must divide n_embd ({self.n_embd}) into heads of an even "
                             "width (rotary embeddings turn pairs of channels)")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError(f"rms_norm_eps and rope_theta must be positive, got {self.rms_norm_eps} and "
                             f"{self.rope_theta}")

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count from the config alone (no allocation); a tied lm_head counted once.

        With ``non_embedding`` the input embedding is left out when it is a table of its own (a lookup, no
        matmul), as GPT-2's position table is: what the FLOPs formula counts. The head is always in.
        """
        d, inner, table = self.n_embd, self.intermediate_size, self.vocab_size * self.n_embd
        per_layer = 2 * d + 4 * d * d + 3 * d * inner  # two RMSNorms, q k v o, gate up down
        head_and_final_norm = table + d
        input_table = 0 if self.tie_embeddings else table
        total = input_table + self.n_layer * per_layer + head_and_final_norm
        return total - input_table if non_embedding else total

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token (forward + backward): model.flops.training_flops_per_token."""
        return training_flops_per_token(self.num_params(), self.n_layer, self.n_embd, seq_len or self.block_size)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, in float32 whatever the input's dtype, returned in the input's."""

    def __init__(self, ndim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.eps = eps

    def forward(self, x):
        wide = x.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_tables(head_dim: int, positions: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (positions, head_dim), float32: channel i and i + head_dim/2 turn together at the
    angle position x theta^(-2i / head_dim)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x, cos, sin):
    """Rotary embedding of ``x`` (batch, heads, seq, head_dim): each pair (x_i, x_{i + head_dim/2}) turned."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class CausalSelfAttention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        d = config.n_embd
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.n_head = config.n_head

    def forward(self, x, cos, sin):
        batch, seq, channels = x.size()
        q, k, v = (proj(x).view(batch, seq, self.n_head, channels // self.n_head).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).contiguous().view(batch, seq, channels))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.self_attn = CausalSelfAttention(config)
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.norm = RMSNorm(config.n_embd, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.embed_tokens.weight = self.lm_head.weight
        # As GPT's (model/gpt.py): tokens per chunk of the chunked cross-entropy when forward gets targets; 0: plain.
        self.loss_chunk_size = 0
        # Not in the state dict: derived from the config, as transformers' LlamaForCausalLM derives its own.
        cos, sin = rotary_tables(config.n_embd // config.n_head, config.block_size, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)

    def forward(self, idx, targets=None):
        """(logits, loss) of token ids ``idx`` (batch, seq), as ``model.GPT.forward``: with ``targets`` and
        ``loss_chunk_size`` > 0 the logits are never materialised and the first element is None."""
        seq = idx.size(1)
        if seq > self.config.block_size:
            raise ValueError(f"sequence of length {seq} exceeds the model's block_size {self.config.block_size}")
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        x = self.norm(x)
        if targets is not None and self.loss_chunk_size:
            return None, linear_cross_entropy(x, self.lm_head.weight, targets, self.loss_chunk_size)
        logits = self.lm_head(x)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
