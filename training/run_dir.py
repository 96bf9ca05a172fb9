"""One run per directory: the directory is locked while a run writes to it, a fresh start does not take over
another run's checkpoints or log, and a directory that cannot be written is found before any step is lost."""
import datetime
import errno
import fcntl
import logging
import os
import socket
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from training.checkpoint import checkpoint_dir
from training.metrics import METRICS_FILE

log = logging.getLogger("train")

LOCK_FILE = "run.lock"


class RunDirectoryError(ValueError):
    """The run directory cannot be used as asked; the message says why and what to do."""


class RunDirectoryLock:
    """An exclusive lock on ``run_dir`` held while a run writes to it (``flock`` on ``run_dir/run.lock``).

    The kernel drops the lock when its process dies, however it dies, so a crashed run never blocks its own
    resume; the file keeps the holder's host and pid for the message a second run gets. Where the file system
    has no locks (some Lustre mounts), the run goes on with a warning.
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
        self.file = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        file = open(self.path, "a+")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            holder = file.read().strip() or "another process"
            file.close()
            raise RunDirectoryError(
                f"{self.path.parent} is in use by a running training run ({holder}): two runs in one directory "
                "would mix their logs and checkpoints. Give this run its own hydra.run.dir, or stop the other "
                "run first"
            ) from None
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            log.warning("the file system of %s does not support locks (%s): a second run started in this "
                        "directory would not be stopped", self.path.parent, err)
            file.close()
            return
        file.seek(0)
        file.truncate()
        file.write(f"host {socket.gethostname()}, pid {os.getpid()}, since "
                   f"{datetime.datetime.now().isoformat(timespec='seconds')}\n")
        file.flush()
        self.file = file

    def release(self) -> None:
        if self.file is not None:
            self.file.close()  # closing drops the flock; the file stays (unlinking it would race a new holder)
            self.file = None

    def __enter__(self) -> "RunDirectoryLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def check_writable(run_dir: Path) -> None:
    """Write and remove a probe file in ``run_dir/checkpoints`` now, not at the first checkpoint."""
    directory = checkpoint_dir(run_dir)
    probe = directory / f".write-probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"probe")
        probe.unlink()
    except OSError as err:
        raise RunDirectoryError(
            f"cannot write checkpoints to {directory} ({err.strerror or err}): give the run a writable "
            "hydra.run.dir, or fix the directory's permissions or space"
        ) from None


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete temporary files of saves that never finished (a crash or a full disk mid-save)."""
    for partial in checkpoint_dir(run_dir).glob("*.tmp"):
        log.warning("removing %s, a checkpoint save that never finished", partial)
        partial.unlink()


def previous_run_files(run_dir: Path) -> list[Path]:
    """The checkpoints and the non-empty metrics log that a run left in ``run_dir``."""
    files = sorted(checkpoint_dir(run_dir).glob("ckpt_*.pt"))
    metrics = Path(run_dir) / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        files.append(metrics)
    return files


def claim_for_fresh_start(run_dir: Path, overwrite: bool) -> None:
    """A run starting from step 0 owns ``run_dir``: refuse one that holds another run's history, or, with
    ``overwrite``, delete that history (nothing of the old run may be mixed into the new one)."""
    files = previous_run_files(run_dir)
    if not files:
        return
    listing = ", ".join(str(path) for path in files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
    if not overwrite:
        raise RunDirectoryError(
            f"{run_dir} already holds a run ({listing}). Continue it with train.resume=true, start over in it "
            "with train.overwrite=true (deletes those files), or give this run another hydra.run.dir"
        )
    log.warning("train.overwrite=true: deleting the previous run's %s", listing)
    for path in files:
        path.unlink()


def set_aside_orphan_log(run_dir: Path) -> Path | None:
    """A resume that finds a metrics log but no checkpoint starts from step 0: keep the old log under a new
    name rather than writing over it. Returns where it went."""
    metrics = Path(run_dir) / METRICS_FILE
    if not metrics.is_file() or metrics.stat().st_size == 0:
        return None
    stamp = datetime.datetime.fromtimestamp(metrics.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
    kept = metrics.with_name(f"metrics.before-restart-{stamp}.jsonl")
    metrics.rename(kept)
    return kept


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Checks and tidying before a run writes into ``run_dir`` (rank 0, with the directory locked)."""
    check_writable(run_dir)
    remove_partial_checkpoints(run_dir)
    if not resume:
        claim_for_fresh_start(run_dir, overwrite)
    elif not any(checkpoint_dir(run_dir).glob("ckpt_*.pt")):
        kept = set_aside_orphan_log(run_dir)
        if kept is not None:
            log.warning("train.resume=true but %s has no checkpoint: the run starts from step 0, and the log of "
                        "the attempt before is kept as %s", run_dir, kept)


def write_hydra_record(run_dir: Path, cfg: DictConfig) -> None:
    """What Hydra writes to .hydra/ (config, Hydra's own config, command-line overrides), written once the
    run owns the directory (Hydra's own copy is off: configs/config.yaml sets hydra.output_subdir to null)."""
    record = Path(run_dir) / ".hydra"
    record.mkdir(parents=True, exist_ok=True)
    hydra_root = HydraConfig.instance().cfg  # {"hydra": ...}, as Hydra saves it
    for name, content in (("config.yaml", cfg), ("hydra.yaml", hydra_root),
                          ("overrides.yaml", hydra_root.hydra.overrides.task)):
        (record / name).write_text(OmegaConf.to_yaml(content))
