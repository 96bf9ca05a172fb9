"""Run under torchrun: after DDP training with MARS, every rank must hold exactly the same parameters.

Each rank trains on its own batches; DDP averages the gradients, and the optimizer step (including MARS's
remembered gradient, copied out of DDP's gradient buckets) must then agree bit for bit across ranks.
Exits non-zero if any rank differs.
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mars import MARS
from model import GPT, GPTConfig


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    ddp_model = DistributedDataParallel(model)
    optimizer = MARS(model.parameters(), lr=1e-2, mars_type=sys.argv[1], backend="torch")
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(4):
        idx = torch.randint(0, 64, (2, 8), generator=generator)
        ddp_model(idx, idx)[1].backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keeps DDP's bucket views as .grad: the remembered grad must copy
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    identical = all(torch.equal(gathered[0], other) for other in gathered)
    dist.destroy_process_group()
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
