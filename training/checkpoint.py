"""Checkpoints written atomically: a crash mid-save leaves the previous checkpoint intact and loadable."""
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, state: dict, keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``step`` (temp file, fsync, rename), then keep the newest ``keep``."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt_{step:08d}.pt"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in sorted(directory.glob("ckpt_*.pt"))[:-keep]:
        old.unlink()
    return path


def load_checkpoint(path: Path, device: torch.device) -> dict:
    return torch.load(path, map_location=device, weights_only=True)


def latest_checkpoint(run_dir: Path, device: torch.device) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, skipping (and reporting) any that are corrupt."""
    for path in sorted(checkpoint_dir(run_dir).glob("ckpt_*.pt"), reverse=True):
        try:
            return path, load_checkpoint(path, device)
        except Exception as err:  # a torn or foreign file: fall back to the previous checkpoint
            log.warning("skipping unreadable checkpoint %s: %s", path, err)
    return None
