"""Hydra callback of the submitit launchers (configs/hydra/launcher/slurm.yaml and local.yaml): each task of
a submitit job becomes one torch.distributed rank, set up as torchrun would set it up."""
import os
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TorchDistributedFromSubmitit(Callback):
    """Before each Hydra job in a submitit task, export torchrun's variables from the task's environment.

    Under SLURM: RANK = SLURM_PROCID, LOCAL_RANK = SLURM_LOCALID, WORLD_SIZE = SLURM_NTASKS, LOCAL_WORLD_SIZE =
    tasks per node, MASTER_ADDR = the job's first host, MASTER_PORT = a port derived from the job id (the same in
    every task); submitit's local executor sets its own equivalents. CUDA_VISIBLE_DEVICES is left alone: each
    rank picks cuda:LOCAL_RANK among the node's GPUs, as under torchrun. A job already under torchrun (RANK set)
    or outside submitit is left untouched.
    """

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "RANK" in os.environ or not os.environ.get("SUBMITIT_EXECUTOR"):
            return
        from submitit.helpers import TorchDistributedEnvironment

        # overwrite: a site profile may preset MASTER_ADDR/MASTER_PORT; the port it sets is kept.
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
