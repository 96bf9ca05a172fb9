"""Run as the ranks of one job (torchrun, or the tests' warm_python.run_ranks): when a training block raises,
training.distributed.distributed_session must still end the Gloo group for good, its worker threads joined while the
interpreter runs, though the optimizers outlive it.

A Gloo worker thread left running into interpreter finalization aborts the process at random ("terminate
called without an active exception", SIGABRT) instead of letting it exit with its status; a leak of the group
makes that possible, and this checks, deterministically, that there is none. Prints each failed check and exits
1 if any fails.
"""
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mars import MARS, Muon
from model import GPT, GPTConfig
from training.distributed import distributed_session


class Stop(Exception):
    """Stands for an error that leaves the training loop, as TrainingDiverged does."""


def gloo_threads() -> list[str]:
    names = [Path(f"/proc/self/task/{task}/comm").read_text().strip() for task in os.listdir("/proc/self/task")]
    return [name for name in names if name.startswith(("pt_gloo", "gloo_"))]


def train_then_fail(optimizers: list[torch.optim.Optimizer]) -> None:
    """A DDP step of MARS-Shampoo and Muon sharing their Newton-Schulz work, then an error."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    ddp_model = DistributedDataParallel(model)
    matrices = [p for p in model.parameters() if p.dim() == 2]
    optimizers += [
        MARS(matrices, mars_type="mars-shampoo", backend="torch", ns_dtype=torch.float32,
             process_group=dist.group.WORLD),
        Muon(matrices, ns_dtype=torch.float32, process_group=dist.group.WORLD),
    ]
    idx = torch.randint(0, 64, (2, 8))
    ddp_model(idx, idx)[1].backward()
    for optimizer in optimizers:
        optimizer.step()
    raise Stop("the loop failed")


def main() -> int:
    optimizers: list[torch.optim.Optimizer] = []  # outlive the group, as an optimizer kept by a caller would
    threads_in_session, threads_after = [], []
    try:
        with distributed_session(torch.device("cpu")):
            threads_in_session = gloo_threads()
            train_then_fail(optimizers)
    except Stop:
        # The error and its traceback are still alive here, as when train.py's main() turns one into SystemExit.
        threads_after = gloo_threads()
    failures = []
    if not threads_in_session:
        failures.append("no Gloo thread while the group was up: this check would prove nothing")
    if threads_after:
        failures.append(f"Gloo threads outlive the session: {threads_after}")
    if len(optimizers) != 2:
        failures.append(f"the training block stopped early: {len(optimizers)} optimizers")
    for optimizer in optimizers:
        try:
            group = optimizer.process_group
        except RuntimeError:
            continue  # the group is gone, and the optimizer says so
        failures.append(f"{type(optimizer).__name__} still holds its process group: {group!r}")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
