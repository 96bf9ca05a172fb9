"""Process-group setup for torchrun (NCCL on GPU, Gloo on CPU); a single process needs none of it."""
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistributedContext:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init_distributed(device: torch.device) -> DistributedContext:
    """Join the torchrun process group if there is one; on CUDA each process takes the GPU of its local rank."""
    if not launched_by_torchrun():
        return DistributedContext(device=device)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, store=elastic_store(), rank=rank, world_size=world_size)
    return DistributedContext(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def elastic_store() -> dist.Store | None:
    """Under torchrun's agent store, a client of it whose keys are private to this restart of the worker group.

    torch's env:// rendezvous reuses the agent's store across ``--max-restarts`` restarts without a per-restart
    prefix, so a restarted group can read the addresses of the dead one and fail to connect (Gloo:
    connectFullMesh "Connection refused"). None (torch's own env:// rendezvous) otherwise.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(minutes=10))
    return dist.PrefixStore(f"restart_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/", store)


def wrap_data_parallel(model: torch.nn.Module, ctx: DistributedContext) -> torch.nn.Module:
    if not ctx.enabled:
        return model
    device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def sum_across_ranks(value: float, ctx: DistributedContext) -> float:
    if not ctx.enabled:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(tensor)
    return tensor.item()


def any_rank(flag: bool, ctx: DistributedContext) -> bool:
    """True on every rank if ``flag`` is true on any rank, so that all ranks take the same branch."""
    return sum_across_ranks(float(flag), ctx) > 0


def all_gather_objects(obj, ctx: DistributedContext) -> list:
    """Every rank's ``obj``, in rank order (a list of one without a process group)."""
    if not ctx.enabled:
        return [obj]
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier(ctx: DistributedContext) -> None:
    if ctx.enabled:
        dist.barrier()


def shutdown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
