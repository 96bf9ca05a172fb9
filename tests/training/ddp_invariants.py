"""Run under torchrun: after DDP training with MARS or Muon, every rank must hold exactly the same parameters.

Each rank trains on its own batches; DDP averages the gradients, and the optimizer step (including MARS's
remembered gradient, copied out of DDP's gradient buckets, and the Newton-Schulz of Muon and MARS-Shampoo
shared out across the ranks) must then agree bit for bit across ranks. Muon and MARS-Shampoo are also checked
against a single-process optimizer stepping a copy of the parameters on the same averaged gradients. Exits
non-zero if any check fails.
"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mars import MARS, Muon
from model import GPT, GPTConfig


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    # Two layers: Muon then has several matrices of each shape to batch and share out.
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    ddp_model = DistributedDataParallel(model)
    params = list(model.parameters())
    shadow = [torch.nn.Parameter(p.detach().clone()) for p in params]
    if sys.argv[1] == "muon":
        # The authors' bfloat16 updates: the ranks all-reduce a bfloat16 buffer.
        muon = dict(lr=2e-2, ns_dtype=torch.float32, update_dtype=torch.bfloat16)
        optimizer = Muon(params, **muon, process_group=dist.group.WORLD)
        shadow_optimizer = Muon(shadow, **muon)
    elif sys.argv[1] == "mars-shampoo":
        # float32 Newton-Schulz: in bfloat16, batching the same matrices differently changes the rounding, and
        # the iteration amplifies it (see tests/mars/test_optimizer.py).
        shampoo = dict(lr=1e-2, mars_type="mars-shampoo", backend="torch", ns_dtype=torch.float32)
        optimizer = MARS(params, **shampoo, process_group=dist.group.WORLD)
        shadow_optimizer = MARS(shadow, **shampoo)
    else:
        optimizer = MARS(params, lr=1e-2, mars_type=sys.argv[1], backend="torch")
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
    identical = all(torch.equal(gathered[0], other) for other in gathered)
    if shadow_optimizer is not None:
        single = torch.cat([p.detach().flatten() for p in shadow])
        torch.testing.assert_close(flat, single, rtol=1e-5, atol=1e-6)
    dist.destroy_process_group()
    sys.exit(0 if identical else 1)


if __name__ == "__main__":
    main()
