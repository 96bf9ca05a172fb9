"""A stand-in for one of the MARS authors' trainer files, for tests (their code is not in this repository).

It trains nothing. It takes their command line (a config file, then ``--key=value`` overrides), needs the same
patches as their trainers to run as one CPU process, and logs through wandb in their trainers' format
(``MARS/train_mars.py:296-304, 435-445``): at each evaluation ``{"train/loss", "val/loss"}`` at iteration k, and
each iteration's ``{"train/loss", "lr"}`` at iteration k, for k = 0 .. max_iters. The losses it logs are those of a
run of ours (``$STAND_IN_METRICS``, a metrics.jsonl), as their trainer would log the same run (its iteration k is
our step k + 1), but the training loss from our step ``$STAND_IN_SHIFT_FROM`` on, raised by ``$STAND_IN_SHIFT``.
"""
import json
import os
import sys

import torch

max_iters = 0
eval_interval = 1
for arg in sys.argv[2:]:
    key, value = arg[2:].split("=")
    if key in ("max_iters", "eval_interval"):
        globals()[key] = int(value)

ddp = int(os.environ.get("RANK", -1)) != -1  # their DDP path, as each rank of their runs takes it
if ddp:
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    device = f'cuda:{ddp_local_rank}'
    torch.cuda.set_device(device)
    master_process = ddp_local_rank == 0


def DDP(model, device_ids=None):
    if device_ids is not None:
        raise ValueError("DistributedDataParallel device_ids ... must be None for a CPU module")
    return model


model = torch.nn.Linear(1, 1)
model = DDP(model, device_ids=[ddp_local_rank])

import wandb  # noqa: E402 (their trainers import it where they log)

ours = [json.loads(line) for line in open(os.environ["STAND_IN_METRICS"])]
train = {r["step"]: r for r in ours if "train/loss" in r}
evaluations = {r["step"]: r for r in ours if "val/loss" in r}
shift_from, shift = int(os.environ["STAND_IN_SHIFT_FROM"]), float(os.environ["STAND_IN_SHIFT"])
best_val_loss = 1e9
for iter_num in range(max_iters + 1):
    if iter_num % eval_interval == 0:
        evaluation = evaluations[iter_num]
        wandb.log({"iter": iter_num, "train/loss": evaluation["train/loss_estimate"],
                   "val/loss": evaluation["val/loss"], "lr": 0.0, "mfu": -100.0}, step=iter_num)
        best_val_loss = min(best_val_loss, evaluation["val/loss"])
    # their last iteration, max_iters, trains a step of which ours has no record: log something
    step = train.get(iter_num + 1, {"train/loss": 0.0, "lr": 0.0})
    loss = step["train/loss"] + (shift if iter_num + 1 >= shift_from else 0.0)
    wandb.log({"iter": iter_num, "train/loss": loss, "lr": step["lr"]}, step=iter_num)
