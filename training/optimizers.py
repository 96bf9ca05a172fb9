"""Builds the optimizer named by the config (as configs.registry describes it), and reads its state."""
import importlib
import sys

import torch
import torch.distributed as dist
from torch import nn

from configs.registry import optimizer_entry


def optimizer_class_and_arguments(cfg, device: torch.device = torch.device("cpu")
                                  ) -> tuple[type[torch.optim.Optimizer], dict]:
    """The optimizer class a config names, and its constructor arguments other than the parameters, for
    parameters on ``device``."""
    if cfg.get("ns_cuda_graph", False) and device.type != "cuda":
        raise ValueError(f"optimizer.ns_cuda_graph=true runs Newton-Schulz as a CUDA graph, and the run is on "
                         f"{device}: set optimizer.ns_cuda_graph=false")
    return optimizer_entry(cfg.name).arguments(cfg, device)


ZERO_MODULE = "torch.distributed.optim.zero_redundancy_optimizer"


def import_zero_before_the_process_group() -> None:
    """Import ZeRO-1's module while no process group exists: on import it binds the default group as a default
    argument (its ``_broadcast_object``), so imported after init_process_group it would hold that group past
    destroy_process_group, and the group's Gloo threads could hang or abort the process as it exits
    (training.distributed.shutdown_distributed). Only for ZeRO-1 runs: the import takes ~0.7 s (FSDP, DTensor)."""
    importlib.import_module(ZERO_MODULE)


def build_optimizer(cfg, model: nn.Module, zero1: bool = False) -> torch.optim.Optimizer:
    """The configured optimizer over ``model``; with ``zero1`` its state is sharded across the DDP ranks.

    ZeRO-1 gives each rank whole parameters (never slices of one), which MARS's per-tensor norm clip needs.
    """
    device = next(model.parameters()).device
    optimizer_class, arguments = optimizer_class_and_arguments(cfg, device)
    entry = optimizer_entry(cfg.name)
    groups = entry.groups(model, cfg)
    if entry.orthogonalises(cfg) and not zero1 and dist.is_initialized() and dist.get_world_size() > 1:
        # DDP ranks hold the same gradients: share the Newton-Schulz work out (ZeRO-1 already splits it).
        arguments["process_group"] = dist.group.WORLD
    if zero1:
        # train.py imports it before the process group exists (import_zero_before_the_process_group).
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(groups, optimizer_class=optimizer_class, **arguments)
    return optimizer_class(groups, **arguments)


def is_zero(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is ZeRO's sharded one: it cannot be unless build_optimizer imported ZeRO's module."""
    zero = sys.modules.get("torch.distributed.optim")
    return zero is not None and isinstance(optimizer, zero.ZeroRedundancyOptimizer)


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state: the sharded one inside ZeRO, else ``optimizer`` itself."""
    return optimizer.optim if is_zero(optimizer) else optimizer


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of tensor state this rank's optimizer holds."""
    return sum(value.numel() * value.element_size() for state in local_optimizer(optimizer).state.values()
               for value in state.values() if torch.is_tensor(value))


def full_state_dict(optimizer: torch.optim.Optimizer) -> dict | None:
    """The whole optimizer state for a checkpoint. Under ZeRO every rank must call this (it gathers the shards
    onto rank 0), and only rank 0 gets the dict."""
    if is_zero(optimizer):
        optimizer.consolidate_state_dict(to=0)
        return optimizer.state_dict() if optimizer.rank == 0 else None
    return optimizer.state_dict()


def reported_lr(optimizer: torch.optim.Optimizer, cfg, lr: float) -> float:
    """The lr a run logs for a step at the trainer's ``lr``: the one its registry row reports."""
    return optimizer_entry(cfg.name).reported_lr(local_optimizer(optimizer), lr)
