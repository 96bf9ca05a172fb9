"""Builds the optimizer named by the config, with the parameter grouping every optimizer shares."""
import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer


log = logging.getLogger("train")


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


# Parameter names the MARS-M authors keep out of the matrix rule (MARS_M/train_mars_m.py:212-219): embeddings and
# the head, which is tied to the token embedding here.
EMBEDDING_NAMES = ("wte", "wpe", "lm_head", "embed_tokens")


def matrix_rule_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """MARS-M's and Moonlight's grouping: 2-D weights other than embeddings take the matrix rule, the rest
    AdamW; every tensor decays at ``weight_decay``, as the authors' optimizers apply one ``wd`` to both."""
    matrices, others = [], []
    for name, param in model.named_parameters():  # yields tied weights once
        if not param.requires_grad:
            continue
        matrix = param.dim() == 2 and not any(part in name for part in EMBEDDING_NAMES)
        (matrices if matrix else others).append(param)
    return [{"params": matrices, "matrix_rule": True, "weight_decay": weight_decay},
            {"params": others, "matrix_rule": False, "weight_decay": weight_decay}]


def optimizer_class_and_arguments(cfg, device: torch.device = torch.device("cpu")
                                  ) -> tuple[type[torch.optim.Optimizer], dict]:
    """The optimizer class a config names, and its constructor arguments other than the parameters, for
    parameters on ``device``."""
    if cfg.get("ns_cuda_graph", False) and device.type != "cuda":
        raise ValueError(f"optimizer.ns_cuda_graph=true runs Newton-Schulz as a CUDA graph, and the run is on "
                         f"{device}: set optimizer.ns_cuda_graph=false")
    if cfg.name == "adamw":
        # The fused kernel is the fastest AdamW on CUDA and on the CPU alike (results/bench_optimizer_cpu.md).
        return torch.optim.AdamW, dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, fused=True)
    if cfg.name == "mars":
        from mars import MARS
        from mars.optimizer import triton_interpreter_enabled

        if cfg.backend == "triton" and device.type != "cuda" and not triton_interpreter_enabled():
            raise ValueError(f"optimizer.backend=triton needs a CUDA device, and the run is on {device}: use "
                             "optimizer.backend=auto (Triton on CUDA, PyTorch elsewhere) or torch")
        return MARS, dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                          amsgrad=cfg.amsgrad, gamma=cfg.gamma, is_approx=cfg.is_approx, mars_type=cfg.mars_type,
                          optimize_1d=cfg.optimize_1d, lr_1d=cfg.lr_1d, betas_1d=tuple(cfg.betas_1d),
                          weight_decay_1d=cfg.weight_decay_1d, backend=cfg.backend,
                          ns_dtype=newton_schulz_dtype(cfg.ns_dtype, device=device,
                                                       runs=cfg.mars_type == "mars-shampoo"),
                          ns_form=cfg.ns_form, ns_cuda_graph=cfg.ns_cuda_graph)
    if cfg.name == "muon":
        from mars import Muon

        return Muon, dict(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, ns_steps=cfg.ns_steps,
                          weight_decay=cfg.weight_decay, adamw_lr=cfg.adamw_lr, adamw_betas=tuple(cfg.adamw_betas),
                          adamw_eps=cfg.adamw_eps, adamw_weight_decay=cfg.adamw_weight_decay,
                          ns_dtype=newton_schulz_dtype(cfg.ns_dtype, device=device),
                          adamw_variant=cfg.adamw_variant,
                          update_dtype=newton_schulz_dtype(cfg.update_dtype, key="update_dtype"),
                          ns_form=cfg.ns_form, ns_cuda_graph=cfg.ns_cuda_graph)
    if cfg.name in ("mars-m", "moonlight"):
        from mars import MarsM, MarsMEfficient, Moonlight

        arguments = dict(lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, ns_steps=cfg.ns_steps,
                         adamw_betas=tuple(cfg.adamw_betas), adamw_eps=cfg.adamw_eps,
                         ns_dtype=newton_schulz_dtype(cfg.ns_dtype, device=device), ns_form=cfg.ns_form,
                         ns_cuda_graph=cfg.ns_cuda_graph)
        if cfg.name == "moonlight":
            return Moonlight, dict(arguments, nesterov=cfg.nesterov)
        if cfg.memory_efficient:
            if not cfg.is_approx:
                raise ValueError("optimizer.memory_efficient=true has the approximate scheme only: set "
                                 "optimizer.is_approx=true, or memory_efficient=false for the exact scheme")
            return MarsMEfficient, dict(arguments, gamma=cfg.gamma)
        return MarsM, dict(arguments, gamma=cfg.gamma, clip_c=cfg.clip_c, is_approx=cfg.is_approx)
    raise ValueError(f"unknown optimizer {cfg.name!r}")


NEWTON_SCHULZ_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def newton_schulz_dtype(name: str, key: str = "ns_dtype", device: torch.device | None = None,
                        runs: bool = True) -> torch.dtype:
    """The dtype that ``optimizer.<key>`` names: Newton-Schulz's, or that of Muon's updates (same choices).

    ``auto`` (Newton-Schulz only) is the authors' bfloat16 on CUDA and float32 elsewhere: CPUs without bfloat16
    matrix units run bfloat16 products ~10x slower than float32 ones (results/bench_newton_schulz_cpu.md). The
    choice is logged when the optimizer ``runs`` Newton-Schulz (MARS-AdamW and MARS-Lion never do).
    """
    if name == "auto" and device is not None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        if runs:
            log.info("Newton-Schulz in %s on %s (optimizer.%s=auto)", str(dtype).removeprefix("torch."),
                     device.type, key)
        return dtype
    if name not in NEWTON_SCHULZ_DTYPES:
        choices = sorted(NEWTON_SCHULZ_DTYPES) + (["auto"] if device is not None else [])
        raise ValueError(f"optimizer.{key} must be one of {choices}, got {name!r}")
    return NEWTON_SCHULZ_DTYPES[name]


def build_optimizer(cfg, model: nn.Module, zero1: bool = False) -> torch.optim.Optimizer:
    """The configured optimizer over ``model``; with ``zero1`` its state is sharded across the DDP ranks.

    ZeRO-1 gives each rank whole parameters (never slices of one), which MARS's per-tensor norm clip needs.
    """
    device = next(model.parameters()).device
    optimizer_class, arguments = optimizer_class_and_arguments(cfg, device)
    if cfg.name in ("mars-m", "moonlight"):
        groups = matrix_rule_groups(model, cfg.weight_decay)
    else:
        groups = param_groups(model, cfg.weight_decay, cfg.decay_embeddings)
    orthogonalises = (cfg.name in ("muon", "mars-m", "moonlight")
                      or (cfg.name == "mars" and cfg.mars_type == "mars-shampoo"))
    if orthogonalises and not zero1 and dist.is_initialized() and dist.get_world_size() > 1:
        # DDP ranks hold the same gradients: share the Newton-Schulz work out (ZeRO-1 already splits it).
        arguments["process_group"] = dist.group.WORLD
    if zero1:
        return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_class, **arguments)
    return optimizer_class(groups, **arguments)


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state: the sharded one inside ZeRO, else ``optimizer`` itself."""
    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of tensor state this rank's optimizer holds."""
    return sum(value.numel() * value.element_size() for state in local_optimizer(optimizer).state.values()
               for value in state.values() if torch.is_tensor(value))


def full_state_dict(optimizer: torch.optim.Optimizer) -> dict | None:
    """The whole optimizer state for a checkpoint. Under ZeRO every rank must call this (it gathers the shards
    onto rank 0), and only rank 0 gets the dict."""
    if isinstance(optimizer, ZeroRedundancyOptimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if optimizer.rank == 0 else None
    return optimizer.state_dict()
