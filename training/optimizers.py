"""Builds the optimizer named by the config, with the parameter grouping every optimizer shares."""
import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float, decay_embeddings: bool) -> list[dict]:
    """nanoGPT's grouping: weight decay on >=2-D weights; none on biases, norms and other 1-D tensors.

    With ``decay_embeddings=False`` the embedding tables join the no-decay group, as in the MARS authors'
    trainer. (MARS applies its own ``weight_decay_1d`` to 1-D tensors whatever their group says.)
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for param in model.parameters():  # yields tied weights once
        if not param.requires_grad:
            continue
        decayed = param.dim() >= 2 and (decay_embeddings or id(param) not in embeddings)
        (decay if decayed else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(cfg, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
    if cfg.name == "adamw":
        # fused is fastest on CUDA; foreach is the fast path on CPU.
        fast_path = {"fused": True} if device.type == "cuda" else {"foreach": True}
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, **fast_path)
    raise ValueError(f"unknown optimizer {cfg.name!r}")
