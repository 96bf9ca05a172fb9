"""Where and in which precision the run executes, and the seeding that makes it repeatable."""
import contextlib
import random

import numpy as np
import torch

from configs.schema import Precision

# Dense bf16 peak FLOP/s of common accelerators, for MFU; an unknown device reports no MFU.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "4090": 165e12}


def resolve_device(name: str, given_as: str = "train.device=") -> torch.device:
    """The device ``name`` (auto, cpu, cuda, cuda:N) names on this machine; ``given_as``: what the errors write
    before a value, the setting that sets it (a command's flag names itself in argparse's line: "")."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:  # torch's message lists twenty device types this trainer does not run on
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ValueError(f"{given_as}{name} is not a device this trainer runs on: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{given_as}{name} but CUDA is not available here: use {given_as}cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{given_as}{name} but this machine has {torch.cuda.device_count()} CUDA device(s): "
                         f"use cuda:0 to cuda:{torch.cuda.device_count() - 1}, or cuda (under torchrun each rank "
                         "takes its local rank's device)")
    return device


def resolve_dtype(precision: Precision, device: torch.device) -> torch.dtype:
    if precision == Precision.auto:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if precision == Precision.float16 and device.type != "cuda":
        raise ValueError("train.dtype=float16 needs a CUDA device: use bfloat16 or float32 on CPU")
    return getattr(torch, precision.value)


def set_tf32(enabled: bool) -> None:
    """TF32 for float32 matmuls and cuDNN convolutions on CUDA (no effect on CPUs): the MARS authors' setting."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def autocast_context(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS.items() if key in name), None)


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
