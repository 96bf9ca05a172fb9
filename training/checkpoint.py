"""Checkpoints written atomically: a crash mid-save leaves the previous checkpoint intact and loadable."""
import json
import logging
import re
import zipfile
from pathlib import Path

import torch

from training.atomic import atomic_file

log = logging.getLogger(__name__)

# What save_checkpoint names a checkpoint; any other file (a user's ckpt_best.pt) is neither pruned nor resumed.
CHECKPOINT_NAME = re.compile(r"ckpt_(\d+)\.pt")
ZIP_MAGIC = b"PK\x03\x04"  # how every torch.save archive begins
UNREADABLE_SUFFIX = ".unreadable"  # a checkpoint a resume fell back over, kept under this suffix
# What train.finished_checkpoints=none leaves of a finished run's checkpoints: the step it finished at.
DELETED_AT_FINISH = "deleted_at_finish.json"


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written; the partial file is gone and the previous checkpoints are intact."""


class UnreadableCheckpoints(RuntimeError):
    """Checkpoints exist but none of them loads: resuming would silently start the run over."""


class CorruptCheckpoint(ValueError):
    """A checkpoint file's bytes are not what ``save_checkpoint`` wrote: torn, truncated, bit-flipped or foreign."""


class CheckpointReadError(RuntimeError):
    """A checkpoint could not be read for a reason outside its bytes (permissions, I/O): nothing was set aside."""


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


def newest_checkpoint_step(run_dir: Path) -> int:
    """The step of the run's newest checkpoint, 0 if it has none."""
    return max(map(checkpoint_step, checkpoint_files(run_dir)), default=0)


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


def verify_checkpoint(path: Path) -> None:
    """Check each record of the checkpoint's zip archive against the CRC-32 that ``torch.save`` wrote with it.

    ``torch.load`` does not: a bit flipped on disk or in a copy would load as a silently different weight.
    Raises :class:`CorruptCheckpoint`; an ``OSError`` (permissions, I/O) is left to the caller.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except zipfile.BadZipFile as err:
        with open(path, "rb") as f:
            start = f.read(len(ZIP_MAGIC))
        if start != ZIP_MAGIC:  # a torn save still starts as an archive; this file never was one
            raise CorruptCheckpoint(f"{path} is not a checkpoint written by train.py (those are torch.save archives; "
                                    f"this file {_looks_like(path, start)}): pass a run directory of train.py or one "
                                    "of its checkpoints/ckpt_*.pt files") from None
        raise CorruptCheckpoint(f"{path} is not a whole checkpoint (a torn or truncated write: {err})") from None
    if damaged is not None:
        raise CorruptCheckpoint(f"{path}: its record {damaged} does not match the checksum written with it (its "
                                "bytes changed after the save: a disk or copy error)")


def _looks_like(path: Path, start: bytes) -> str:
    if path.suffix == ".safetensors":
        return "is a safetensors file: weights only, as an export writes them"
    return "is empty" if not start else f"starts with {start!r}"


def load_checkpoint(path: Path, device: torch.device) -> dict:
    """The state saved in ``path``, its bytes verified first.

    Raises :class:`CorruptCheckpoint` for a file that is not a whole, unchanged checkpoint; an ``OSError`` or
    an out-of-memory error (the file may be fine) propagates as it is.
    """
    verify_checkpoint(path)
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except (OSError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as err:  # torch.load's errors for unexpected content vary: pickle, zip, EOF, KeyError...
        raise CorruptCheckpoint(f"{path} does not load as a checkpoint ({type(err).__name__}: {err})") from None


def latest_checkpoint(run_dir: Path, device: torch.device) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads, skipping (and reporting) any that are corrupt; None when there is none.

    Raises :class:`UnreadableCheckpoints` when there are checkpoints and none loads, and
    :class:`CheckpointReadError` when one cannot be read at all (permissions, I/O): skipping a checkpoint that
    may be fine would resume from an older one and set the newer aside.
    """
    paths = checkpoint_files(run_dir)[::-1]
    for path in paths:
        try:
            return path, load_checkpoint(path, device)
        except CorruptCheckpoint as err:  # a torn, damaged or foreign file: fall back to the previous checkpoint
            log.warning("skipping unreadable checkpoint: %s", err)
        except OSError as err:
            raise CheckpointReadError(
                f"could not read {path} ({err}); nothing was resumed or set aside. Fix the file system (permissions, "
                "mount, disk) and resume again") from err
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
            target = path.with_name(path.name + UNREADABLE_SUFFIX)
            path.rename(target)
            log.warning("set aside %s (newer than the checkpoint resumed from, and unreadable) as %s", path,
                        target.name)
            set_aside.append(target)
    return set_aside


def keep_when_finished(run_dir: Path, step: int, policy: str) -> list[Path]:
    """Once a run has finished at ``step``, keep the checkpoints that ``policy`` (train.finished_checkpoints) asks
    for: ``all``, the ``last`` one, or ``none`` (a finished sweep point has nothing left to resume). ``none``
    leaves a record of the step, so that a resume knows the run finished instead of starting it over. Returns
    the deleted files."""
    files = checkpoint_files(run_dir)
    deleted = {"all": [], "last": files[:-1], "none": files}[policy]
    if policy == "none":
        with atomic_file(checkpoint_dir(run_dir) / DELETED_AT_FINISH) as f:
            json.dump({"step": step, "deleted": [path.name for path in deleted]}, f)
    for path in deleted:
        path.unlink()
    return deleted


def finished_without_checkpoints(run_dir: Path) -> int | None:
    """The step a run finished at whose checkpoints were then deleted (train.finished_checkpoints=none), or None."""
    record = checkpoint_dir(run_dir) / DELETED_AT_FINISH
    return json.loads(record.read_text())["step"] if record.is_file() else None
