"""Run as the 2 ranks of one job (torchrun, or the tests' warm_python.run_ranks): train.read_step_scalars agrees
every rank on the loss and the stop signal, and stops every rank alike, before the update, when one rank's batch held
a token id beyond the vocabulary."""
import sys

import numpy as np
import torch

from data.loader import TokenBatches, TokenIdOutOfRange
from train import read_step_scalars
from training.distributed import all_gather_objects, distributed_session

VOCAB = 50


def batches_of(ctx, tokens: np.ndarray) -> TokenBatches:
    """Sequential windows of 4 tokens, one per rank and step: rank r's first window is tokens 4r to 4r + 4."""
    return TokenBatches(tokens, "train", batch_size=1, block_size=4, seed=0, sampling="sequential",
                        rank=ctx.rank, world_size=ctx.world_size, vocab_size=VOCAB)


def main() -> int:
    failures = []
    with distributed_session(torch.device("cpu")) as ctx:
        loss = torch.tensor(1.0 + ctx.rank, dtype=torch.float64)  # ranks 0 and 1: losses 1 and 2
        grad_norm, lookahead_norm = torch.tensor(0.5), torch.tensor(0.25)
        clean = batches_of(ctx, np.arange(64) % VOCAB)
        for signalled_rank in (None, 0, 1):
            result = read_step_scalars(loss, grad_norm, lookahead_norm, ctx.rank == signalled_rank, clean, ctx)
            expected = (1.5, 0.5, 0.25, signalled_rank is not None)
            if result != expected:
                failures.append(f"rank {ctx.rank}, signal on rank {signalled_rank}: {result} != {expected}")

        tokens = np.arange(64) % VOCAB
        tokens[6] = VOCAB + 7  # in rank 1's window only
        batches = batches_of(ctx, tokens)
        x, y = batches.batch(0)
        if int(torch.cat([x, y]).max()) >= VOCAB:
            failures.append(f"rank {ctx.rank}: an id beyond the vocabulary reached the model: {x}, {y}")
        try:
            read_step_scalars(loss, grad_norm, lookahead_norm, False, batches, ctx)
            told = None
        except TokenIdOutOfRange as err:
            told = f"{err}"
        messages = all_gather_objects(told, ctx)
        if ctx.rank == 0:
            if len(set(messages)) != 1 or messages[0] is None:
                failures.append(f"the ranks did not stop alike on rank 1's token id {VOCAB + 7}: {messages}")
            print(messages[0])
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
