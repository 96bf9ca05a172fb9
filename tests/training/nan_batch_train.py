"""train.py with one training micro-batch whose loss, and so its gradient, is NaN: as a micro-batch that overflows
would give. Run as ``python -m tests.training.nan_batch_train N <overrides>``: the N-th forward pass in training mode
(from 1, over the look-ahead passes of exact MARS and the step's passes alike) is the NaN one."""
import sys

import train
from model import GPT


def poisoned_forward(forward, number: int):
    """GPT's ``forward``, but for its ``number``-th pass in training mode, whose loss is NaN."""
    passes = 0

    def poisoned(self, idx, targets=None):
        nonlocal passes
        logits, loss = forward(self, idx, targets)
        if self.training and targets is not None:
            passes += 1
            if passes == number:
                loss = loss * float("nan")
        return logits, loss

    return poisoned


if __name__ == "__main__":
    GPT.forward = poisoned_forward(GPT.forward, int(sys.argv.pop(1)))
    train.main()
