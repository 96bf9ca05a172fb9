"""Checkpoints written atomically: a crash mid-save leaves the previous checkpoint intact and loadable."""
import logging
import re
from pathlib import Path

import torch

from training.atomic import atomic_file

log = logging.getLogger(__name__)

# What save_checkpoint names a checkpoint; any other file (a user's ckpt_best.pt) is neither pruned nor resumed.
CHECKPOINT_NAME = re.compile(r"ckpt_(\d+)\.pt")


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the partial file is gone and the previous checkpoints are intact."""


class UnreadableCheckpoints(RuntimeError):
    """Checkpoints exist but none of them loads: resuming would silently start the run over."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file was saved at, from its name (ckpt_00000250.pt)."""
    return int(CHECKPOINT_NAME.fullmatch(Path(path).name).group(1))


def checkpoint_files(run_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest step first: only files named as ``save_checkpoint`` names them, ordered by
    their step (not their name, which a step past 99,999,999 would outgrow)."""
    paths = [path for path in checkpoint_dir(run_dir).glob("ckpt_*.pt") if CHECKPOINT_NAME.fullmatch(path.name)]
    return sorted(paths, key=checkpoint_step)


def save_checkpoint(run_dir: Path, step: int, state: dict, keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``step`` (temp file, fsync, rename), then keep the newest ``keep``."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt_{step:08d}.pt"
    try:
        with atomic_file(path, "wb") as f:
            torch.save(state, f)
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as a RuntimeError
        # The partial file is gone: it would fill the disk further and confuse the next save.
        raise CheckpointSaveError(f"could not write {path}: {err}") from err
    for old in checkpoint_files(run_dir)[:-keep]:
        old.unlink()
    return path


def load_checkpoint(path: Path, device: torch.device) -> dict:
    return torch.load(path, map_location=device, weights_only=True)


def latest_checkpoint(run_dir: Path, device: torch.device) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, skipping (and reporting) any that are corrupt; None when there is none.

    Raises :class:`UnreadableCheckpoints` when there are checkpoints and none loads.
    """
    paths = checkpoint_files(run_dir)[::-1]
    for path in paths:
        try:
            return path, load_checkpoint(path, device)
        except Exception as err:  # a torn or foreign file: fall back to the previous checkpoint
            log.warning("skipping unreadable checkpoint %s: %s", path, err)
    if paths:
        raise UnreadableCheckpoints(
            f"none of the {len(paths)} checkpoints in {checkpoint_dir(run_dir)} can be read "
            f"({', '.join(p.name for p in paths)}); nothing to resume from. Restore a readable copy, or start over "
            "with train.resume=false train.overwrite=true (deletes them)"
        )
    return None


def set_aside_checkpoints_after(run_dir: Path, step: int) -> list[Path]:
    """Rename the checkpoints past ``step`` (unreadable ones a resume fell back over) to ``*.pt.unreadable``.

    Pruning keeps the highest step numbers: left in place, they would outlive the resumed run's new checkpoints.
    """
    set_aside = []
    for path in checkpoint_files(run_dir):
        if checkpoint_step(path) > step:
            target = path.with_name(path.name + ".unreadable")
            path.rename(target)
            log.warning("set aside %s (newer than the checkpoint resumed from, and unreadable) as %s", path,
                        target.name)
            set_aside.append(target)
    return set_aside
