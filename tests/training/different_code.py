"""Run as the 2 ranks of one job (torchrun, or the tests' warm_python.run_ranks), rank 1 on another commit: both
ranks stop with DifferentCodeOnRanks."""
import sys

import torch

from training import provenance
from training.distributed import distributed_session


def main() -> int:
    with distributed_session(torch.device("cpu")) as ctx:
        commit = "a" * 40 if ctx.rank == 0 else "f" * 40
        provenance.code_version = lambda: {"commit": commit, "diff": b"", "untracked": []}
        try:
            provenance.code_on_every_rank(ctx)
        except provenance.DifferentCodeOnRanks as err:
            print(f"rank {ctx.rank}: {err}")
            return 0
    print(f"rank {ctx.rank} went on", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
