"""Run under torchrun with 2 ranks: train.read_step_scalars agrees every rank on the loss and the stop signal."""
import sys

import torch

from train import read_step_scalars
from training.distributed import distributed_session


def main() -> int:
    failures = []
    with distributed_session(torch.device("cpu")) as ctx:
        loss = torch.tensor(1.0 + ctx.rank, dtype=torch.float64)  # ranks 0 and 1: losses 1 and 2
        grad_norm, lookahead_norm = torch.tensor(0.5), torch.tensor(0.25)
        for signalled_rank in (None, 0, 1):
            result = read_step_scalars(loss, grad_norm, lookahead_norm, ctx.rank == signalled_rank, ctx)
            expected = (1.5, 0.5, 0.25, signalled_rank is not None)
            if result != expected:
                failures.append(f"rank {ctx.rank}, signal on rank {signalled_rank}: {result} != {expected}")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
