"""Run as the ranks of one job (torchrun, or the tests' warm_python.run_ranks): every optimizer config, trained under
DDP, unsharded and under ZeRO-1, agrees across ranks and with one process, on a model of every architecture.

Each rank trains on its own batches; DDP averages the gradients. For every config of configs/optimizer/ (or those
named on the command line), built as train.py builds it (``training.optimizers.build_optimizer``):
- the step of the plain optimizer (MARS's remembered gradient copied out of DDP's gradient buckets, the
  Newton-Schulz of Muon, MARS-Shampoo, MARS-M and Moonlight shared out across the ranks) leaves every rank with
  exactly the same parameters, and the same as a single-process optimizer stepping a copy on the same gradients;
- ZeRO-1 (``train.zero1=true``) steps to the same parameters, and its gathered state has every tensor's.
Prints ``checked <config> on <arch>`` for each config and architecture (model.ARCHITECTURES) on rank 0, each failed check on stderr, and exits 1 if any fails.

The process group is set up and shut down as train.py does (training.distributed.distributed_session): the
model, DDP and the optimizers live only in ``failed_checks``, so they are gone when the group is destroyed,
and the process exits only after that, whatever happened.
"""
import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from configs.compose import CONFIG_DIR, compose_config
from model import ARCHITECTURES
from tests.tiny_models import tiny_model
from training.distributed import distributed_session
from training.optimizers import build_optimizer, import_zero_before_the_process_group

# float32 Newton-Schulz and updates: in bfloat16, orthogonalising the same matrices on other ranks or in other
# batches changes the rounding, and the iteration amplifies it (see tests/mars/test_optimizer.py).
FLOAT32 = {"ns_dtype": "float32", "update_dtype": "float32"}


def optimizer_config(name: str):
    """The ``optimizer`` section of config ``name`` with float32 Newton-Schulz where it has one."""
    keys = compose_config([f"optimizer={name}"]).optimizer
    return compose_config([f"optimizer={name}", *(f"optimizer.{k}={v}" for k, v in FLOAT32.items() if k in keys)]
                          ).optimizer


def step(optimizer) -> None:
    if getattr(optimizer, "needs_lookahead_grad", False):
        optimizer.stash_lookahead_grad()
    optimizer.step()


def failed_checks(name: str, arch: str) -> list[str]:
    rank = dist.get_rank()
    cfg = optimizer_config(name)
    # Two layers: Newton-Schulz then has several matrices of each shape to batch and share out.
    model = tiny_model(arch, n_layer=2)
    single, sharded = copy.deepcopy(model), copy.deepcopy(model)
    ddp_model = DistributedDataParallel(model)
    optimizer = build_optimizer(cfg, model)
    single_optimizer = build_optimizer(cfg, single)
    if getattr(single_optimizer, "process_group", None) is not None:
        single_optimizer.process_group = None  # the one-process reference: Newton-Schulz on this rank alone
    zero1_optimizer = build_optimizer(cfg, sharded, zero1=True)
    params, copies = list(model.parameters()), [list(single.parameters()), list(sharded.parameters())]
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        idx = torch.randint(0, 64, (2, 8), generator=generator)
        ddp_model(idx, idx)[1].backward()
        for each in copies:
            for copied, param in zip(each, params):
                copied.grad = param.grad.clone()
        step(optimizer)
        optimizer.zero_grad(set_to_none=False)  # keeps DDP's bucket views as .grad: the remembered grad must copy
        step(single_optimizer)
        step(zero1_optimizer)
    flat = torch.cat([p.detach().flatten() for p in params])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    failures = [f"rank {other_rank}'s parameters differ from rank 0's"
                for other_rank, other in enumerate(gathered) if not torch.equal(gathered[0], other)]
    for what, each in zip(("a single process's", "ZeRO-1's"), copies):
        try:
            torch.testing.assert_close(flat, torch.cat([p.detach().flatten() for p in each]), rtol=1e-5, atol=1e-6)
        except AssertionError as mismatch:
            failures.append(f"the DDP steps differ from {what}: {mismatch}")
    zero1_optimizer.consolidate_state_dict(to=0)
    if rank == 0:
        state = zero1_optimizer.state_dict()["state"]
        keys = sorted(sorted(each) for each in state.values())
        expected = sorted(sorted(each) for each in optimizer.state_dict()["state"].values())
        if keys != expected:
            failures.append(f"ZeRO-1's gathered state has {len(keys)} tensors' ({keys[:1]}...), the plain optimizer "
                            f"{len(expected)} ({expected[:1]}...)")
    return failures


def main() -> int:
    names = sys.argv[1:] or sorted(path.stem for path in Path(CONFIG_DIR, "optimizer").glob("*.yaml"))
    import_zero_before_the_process_group()  # as train.py does for ZeRO-1
    with distributed_session(torch.device("cpu")) as ctx:  # each config in turn
        failures = []
        for name in names:
            for arch in ARCHITECTURES:
                failures += [f"{name} on {arch}: {failure}" for failure in failed_checks(name, arch)]
                if ctx.rank == 0:
                    print(f"checked {name} on {arch}", flush=True)
    for failure in failures:
        print(f"rank {ctx.rank}: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
