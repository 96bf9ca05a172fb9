"""Run under torchrun: after DDP training with MARS or Muon, every rank must hold exactly the same parameters.

Each rank trains on its own batches; DDP averages the gradients, and the optimizer step (including MARS's
remembered gradient, copied out of DDP's gradient buckets, and the Newton-Schulz of Muon and MARS-Shampoo
shared out across the ranks) must then agree bit for bit across ranks. Muon and MARS-Shampoo are also checked
against a single-process optimizer stepping a copy of the parameters on the same averaged gradients. Checks each
optimizer named on the command line; prints each failed check and exits 1 if any fails.

The process group is set up and shut down as train.py does (training.distributed.distributed_session): the
model, DDP and the optimizers live only in ``failed_checks``, so they are gone when the group is destroyed,
and the process exits only after that, whatever happened.
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mars import MARS, Muon
from model import GPT, GPTConfig
from training.distributed import distributed_session


def failed_checks(optimizer_name: str) -> list[str]:
    rank = dist.get_rank()
    torch.manual_seed(0)
    # Two layers: Muon then has several matrices of each shape to batch and share out.
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    ddp_model = DistributedDataParallel(model)
    params = list(model.parameters())
    shadow = [torch.nn.Parameter(p.detach().clone()) for p in params]
    if optimizer_name == "muon":
        optimizer = Muon(params, lr=2e-2, ns_dtype=torch.float32, process_group=dist.group.WORLD)
        shadow_optimizer = Muon(shadow, lr=2e-2, ns_dtype=torch.float32)
    elif optimizer_name == "mars-shampoo":
        # float32 Newton-Schulz: in bfloat16, batching the same matrices differently changes the rounding, and
        # the iteration amplifies it (see tests/mars/test_optimizer.py).
        shampoo = dict(lr=1e-2, mars_type="mars-shampoo", backend="torch", ns_dtype=torch.float32)
        optimizer = MARS(params, **shampoo, process_group=dist.group.WORLD)
        shadow_optimizer = MARS(shadow, **shampoo)
    else:
        optimizer = MARS(params, lr=1e-2, mars_type=optimizer_name, backend="torch")
        shadow_optimizer = None
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        idx = torch.randint(0, 64, (2, 8), generator=generator)
        ddp_model(idx, idx)[1].backward()
        for copy, param in zip(shadow, params):
            copy.grad = param.grad.clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keeps DDP's bucket views as .grad: the remembered grad must copy
        if shadow_optimizer is not None:
            shadow_optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in params])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    failures = [f"rank {other_rank}'s parameters differ from rank 0's"
                for other_rank, other in enumerate(gathered) if not torch.equal(gathered[0], other)]
    if shadow_optimizer is not None:
        single = torch.cat([p.detach().flatten() for p in shadow])
        try:
            torch.testing.assert_close(flat, single, rtol=1e-5, atol=1e-6)
        except AssertionError as mismatch:
            failures.append(f"the shared Newton-Schulz steps differ from a single process's: {mismatch}")
    return failures


def main() -> int:
    with distributed_session(torch.device("cpu")) as ctx:  # each optimizer named on the command line, in turn
        failures = [f"{name}: {failure}" for name in sys.argv[1:] for failure in failed_checks(name)]
    for failure in failures:
        print(f"rank {ctx.rank}: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
