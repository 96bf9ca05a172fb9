"""One run per directory: the directory is locked while a run writes to it, a fresh start does not take over
another run's checkpoints or log, and a directory that cannot be written is found before any step is lost."""
import contextlib
import datetime
import hashlib
import fcntl
import itertools
import logging
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import TextIO

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from data.writer_lock import LOCKS_UNSUPPORTED  # a file system without flock: the run goes on unprotected
from training.atomic import TEMPORARY_SUFFIX
from training.checkpoint import (DELETED_AT_FINISH, UNREADABLE_SUFFIX, checkpoint_dir, checkpoint_files,
                                 finished_without_checkpoints)
from training.distributed import DistributedContext, all_gather_objects, stop_with_message
from training.metrics import METRICS_FILE, WANDB_DIR
from training.provenance import patch_files

log = logging.getLogger("train")

LOCK_FILE = "run.lock"
HYDRA_LOG = "train.log"  # Hydra's job log, ${hydra.job.name}.log, opened (appending) before the lock is taken
SET_ASIDE_LOG = "metrics.before-restart-{stamp}.jsonl"
LOCK_ATTEMPTS = 3


class RunDirectoryError(ValueError):
    """The run directory cannot be used as asked; the message says why and what to do."""


class RunDirectoryInUse(RunDirectoryError):
    """Another live process holds the run directory's lock (``holder``: its host and pid, as run.lock names them)."""

    holder = ""


class RunDirectoryTaken(RunDirectoryError):
    """A fresh start found another run's records in the run directory."""


class RunDirectoryLock:
    """An exclusive lock on ``run_dir`` held while a run writes to it: ``flock`` on the directory itself and on
    ``run_dir/run.lock``.

    The kernel drops both when the process dies, however it dies, so a crashed run never blocks its own resume.
    The directory's lock cannot be lifted by deleting a file (a user removing a "stale" run.lock while the run
    lives); run.lock's is the one other hosts see on NFS (where a directory's flock is local to each host), and
    the file keeps the holder's host and pid for the message a second run gets. A run.lock deleted while the run
    lives is locked again before each checkpoint (:meth:`hold_on`). Where the file system has no locks (some
    Lustre mounts), the run goes on with a warning.

    A launch that does not take the directory over (``taken_over``: it was refused, or had nothing to do) puts
    back, at its release, the holder that run.lock named before: it leaves another run's directory as it was.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.directory = None  # descriptor of the locked directory
        self.file = None
        self.taken_over = False
        self.previous_holder: str | None = None  # what run.lock said before this lock wrote its holder

    def acquire(self) -> None:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.directory = self._lock_directory()
            self.file = self._lock_file()
            if self.file is not None:
                self._write_holder()
        except OSError as err:  # a vanished, read-only or full run directory
            self.release()
            raise RunDirectoryError(f"cannot lock {self.run_dir} ({err.strerror or err}): give the run a writable "
                                    "hydra.run.dir, or fix the directory's permissions or space") from None
        except BaseException:
            self.release()
            raise

    def _write_holder(self) -> None:
        """Who holds run.lock, for the message a second run gets."""
        self.file.seek(0)
        if self.previous_holder is None:
            self.previous_holder = self.file.read()
            self.file.seek(0)
        self.file.truncate()
        self.file.write(f"host {socket.gethostname()}, pid {os.getpid()}, since "
                        f"{datetime.datetime.now().isoformat(timespec='seconds')}\n")
        self.file.flush()

    def hold_on(self) -> None:
        """Check, before the run writes a checkpoint, that run.lock is still the file this run locked.

        On NFS, deleting run.lock (a user taking it for a stale lock) lifts the only lock other hosts see: a
        second run could then lock a new run.lock and write here too. A deleted or replaced run.lock is locked
        again; if another run holds it already, :class:`RunDirectoryError` says so, and this run must stop
        before it writes anything more.
        """
        if self.file is None or self._path_names(self.file):
            return
        log.warning("%s was deleted or replaced while this run held it: locking it again", self.path)
        lost = self.file
        try:
            self.file = self._lock_file()
        except RunDirectoryError:
            self.file = lost
            raise RunDirectoryError(
                f"{self.path} was deleted or replaced while this run held it, and another run "
                f"({self.holder() or 'unknown'}) has locked {self.run_dir} since: two runs write into it. This run "
                "stops before it writes there again; see which run's checkpoints and metrics.jsonl lines to keep "
                "before resuming either") from None
        lost.close()
        if self.file is not None:
            self._write_holder()

    def _lock_directory(self) -> int | None:
        """Open and lock the directory; ``None`` where its file system cannot (run.lock's lock then stands alone)."""
        directory = os.open(self.run_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            unsupported = self._flock(directory)
        except BaseException:
            os.close(directory)
            raise
        if unsupported is not None:
            os.close(directory)
            return None
        return directory

    def _lock_file(self) -> TextIO | None:
        """Open and lock run.lock; ``None`` where the file system has no locks."""
        for _ in range(LOCK_ATTEMPTS):
            file = open(self.path, "a+")
            try:
                unsupported = self._flock(file)
            except BaseException:
                file.close()
                raise
            if unsupported is not None:
                file.close()
                log.warning("the file system of %s does not support locks (%s): a second run started in this "
                            "directory%s would not be stopped", self.run_dir, unsupported,
                            " on another host" if self.directory is not None else "")
                return None
            if self._path_names(file):
                return file
            # run.lock was deleted or replaced between open and flock: the lock is on a file no one else will
            # open, so lock the one the path names now.
            file.close()
        raise RunDirectoryError(f"{self.path} was deleted or replaced {LOCK_ATTEMPTS} times while this run locked "
                                "it: stop whatever removes it, or give this run its own hydra.run.dir")

    def _path_names(self, file: TextIO) -> bool:
        """Whether the path run.lock still names the open ``file`` (not deleted, not replaced)."""
        try:
            return os.path.samestat(os.fstat(file.fileno()), os.stat(self.path))
        except FileNotFoundError:
            return False

    def _flock(self, target) -> OSError | None:
        """``flock`` the directory's descriptor or run.lock; returns the error of a file system without locks."""
        try:
            fcntl.flock(target, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            in_use = RunDirectoryInUse(
                f"{self.run_dir} is in use by a running training run ({self.holder() or 'another process'}): two "
                "runs in one directory would mix their logs and checkpoints. Give this run its own hydra.run.dir, "
                "or stop the other run first")
            in_use.holder = self.holder()  # kept when the error travels to the other ranks (pickled)
            raise in_use from None
        except OSError as err:
            if err.errno not in LOCKS_UNSUPPORTED:
                raise
            return err
        return None

    def holder(self) -> str:
        """The host and pid that run.lock names (empty if it is gone)."""
        try:
            return self.path.read_text().strip()
        except FileNotFoundError:  # deleted while its holder runs
            return ""

    def release(self) -> None:
        # Closing drops the flocks; run.lock stays (unlinking it would race a new holder).
        if self.file is not None:
            file, self.file = self.file, None
            if not self.taken_over and self.previous_holder is not None:
                with contextlib.suppress(OSError):  # a full disk: the holder line is all that differs
                    file.seek(0)
                    file.truncate()
                    file.write(self.previous_holder)
            with contextlib.suppress(OSError):  # its close flushes what a full disk refused; the flock goes anyway
                file.close()
        if self.directory is not None:
            os.close(self.directory)
            self.directory = None

    def __enter__(self) -> "RunDirectoryLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


_claimed_run_dirs: dict[str, str] = {}


def unique_run_dir(parent: str = "outputs") -> str:
    """A new run directory under ``parent``: named by the start time, or by torchrun's run id under torchrun.

    Every rank of a torchrun job (and every elastic restart of it) sees the same run id, while their clocks may
    straddle a second: the ranks must agree on one directory. torchrun's default run id ("none") is the same in
    every job, so it names no directory: refused. Without torchrun the directory is claimed by
    creating it (atomic, also on shared file systems), with a -2, -3, ... suffix when another run started in
    the same second took the name first. One claim per process, however often the config is resolved.
    """
    if parent in _claimed_run_dirs:
        return _claimed_run_dirs[parent]
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id == "none":  # torchrun's default run id, without --rdzv-id or --standalone
        raise RunDirectoryError(
            "under torchrun without --rdzv-id the ranks cannot agree on a default run directory (each would "
            "claim its own, and a restarted group would start again from step 0): pass --rdzv-id=<job name> "
            "(or --standalone on one node) to torchrun, or set hydra.run.dir (a sweep: hydra.sweep.dir)")
    if run_id is not None:
        return f"{parent}/torchrun-{run_id}"
    stamp = f"{parent}/{datetime.datetime.now().strftime('%Y-%m-%d/%H-%M-%S')}"
    Path(stamp).parent.mkdir(parents=True, exist_ok=True)
    for attempt in itertools.count(1):
        candidate = stamp if attempt == 1 else f"{stamp}-{attempt}"
        try:
            os.mkdir(candidate)
        except FileExistsError:
            continue
        _claimed_run_dirs[parent] = candidate
        return candidate


# File systems refuse names longer than 255 bytes; a sweep point's name keeps its start readable below that.
MAX_POINT_NAME_BYTES = 200


def sweep_point_name(num: int, overrides: str) -> str:
    """A sweep point's directory name, ``<num>_<its overrides>``: a name too long for the file system is cut and
    ends in a hash of the whole, so that it stays unique and a resumed sweep finds the same directory."""
    name = f"{num}_{overrides}"
    if len(name.encode()) <= MAX_POINT_NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return name.encode()[:MAX_POINT_NAME_BYTES - len(digest) - 1].decode(errors="ignore") + f"-{digest}"


def register_run_dir_resolver() -> None:
    """Let configs/config.yaml name its default run and sweep directories ``${unique_run_dir:outputs}``, and a
    sweep's points ``${sweep_point_name:...}``."""
    if not OmegaConf.has_resolver("unique_run_dir"):
        OmegaConf.register_new_resolver("unique_run_dir", unique_run_dir, use_cache=True)
    if not OmegaConf.has_resolver("sweep_point_name"):
        OmegaConf.register_new_resolver("sweep_point_name", sweep_point_name)


def check_writable(run_dir: Path) -> None:
    """Write and remove a probe file in ``run_dir/checkpoints`` now, not at the first checkpoint. A probe that
    cannot be written (a full disk creates it, then refuses its bytes) is removed, and so is the checkpoints
    directory if the probe made it: a refused launch leaves the directory as it found it."""
    directory = checkpoint_dir(run_dir)
    probe = directory / f".write-probe-{os.getpid()}"
    made_directory = not directory.exists()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"probe")
        probe.unlink()
    except OSError as err:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)
            if made_directory:
                directory.rmdir()
        raise RunDirectoryError(
            f"cannot write checkpoints to {directory} ({err.strerror or err}): give the run a writable "
            "hydra.run.dir, or fix the directory's permissions or space"
        ) from None


def remove_partial_checkpoints(run_dir: Path) -> None:
    """Delete temporary files of saves that never finished (a crash or a full disk mid-save)."""
    for partial in checkpoint_dir(run_dir).glob(f"*{TEMPORARY_SUFFIX}"):
        log.warning("removing %s, a checkpoint save that never finished", partial)
        partial.unlink()


def previous_run_files(run_dir: Path) -> list[Path]:
    """The records a run left in ``run_dir``: its checkpoints (those set aside as unreadable too), its non-empty
    metrics log and the logs set aside at restarts, the patches of its launches' uncommitted code, and its wandb
    runs. (.hydra/ is rewritten by every run.)"""
    run_dir, checkpoints = Path(run_dir), checkpoint_dir(run_dir)
    files = checkpoint_files(run_dir) + sorted(checkpoints.glob(f"ckpt_*.pt{UNREADABLE_SUFFIX}"))
    if (checkpoints / DELETED_AT_FINISH).is_file():
        files.append(checkpoints / DELETED_AT_FINISH)
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        files.append(metrics)
    files += sorted(run_dir.glob(SET_ASIDE_LOG.format(stamp="*"))) + patch_files(run_dir)
    if (run_dir / WANDB_DIR).exists():
        files.append(run_dir / WANDB_DIR)
    return files


def claim_for_fresh_start(run_dir: Path, overwrite: bool) -> None:
    """A run starting from step 0 owns ``run_dir``: refuse one that holds another run's records, or, with
    ``overwrite``, delete them (nothing of the old run may be mixed into the new one)."""
    files = previous_run_files(run_dir)
    if not files:
        return
    listing = ", ".join(str(path) for path in files[:4]) + (f" and {len(files) - 4} more" if len(files) > 4 else "")
    if not overwrite:
        raise RunDirectoryTaken(
            f"{run_dir} already holds a run ({listing}). Continue it with train.resume=true, start over in it "
            "with train.overwrite=true (deletes those files), or give this run another hydra.run.dir"
        )
    hydra_log = Path(run_dir) / HYDRA_LOG
    if hydra_log.is_file():
        # Emptied, not deleted: Hydra already has it open for this run, appending (so at the new end). Emptied
        # first, so that the warning below opens the new run's log.
        os.truncate(hydra_log, 0)
        listing += f", and the old lines of {hydra_log}"
    log.warning("train.overwrite=true: deleting the previous run's %s", listing)
    for path in files:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def set_aside_orphan_log(run_dir: Path) -> Path | None:
    """A resume that finds a metrics log but no checkpoint starts from step 0: keep the old log under a new
    name rather than writing over it. Returns where it went."""
    metrics = Path(run_dir) / METRICS_FILE
    if not metrics.is_file() or metrics.stat().st_size == 0:
        return None
    # In UTC, which a change of time zone or a DST fall-back does not repeat; a counter parts logs of one second.
    stamp = datetime.datetime.fromtimestamp(metrics.stat().st_mtime, datetime.timezone.utc).strftime("%Y%m%d-%H%M%SZ")
    for attempt in itertools.count(1):
        kept = metrics.with_name(SET_ASIDE_LOG.format(stamp=stamp if attempt == 1 else f"{stamp}-{attempt}"))
        if not kept.exists():
            metrics.rename(kept)
            return kept


def prepare_run_dir(run_dir: Path, resume: bool, overwrite: bool) -> None:
    """Checks and tidying before a run writes into ``run_dir`` (rank 0, with the directory locked)."""
    if resume and overwrite:
        raise RunDirectoryError(
            f"train.resume=true continues the run in {run_dir} and train.overwrite=true deletes it: pick one"
        )
    check_writable(run_dir)
    if not resume:
        claim_for_fresh_start(run_dir, overwrite)
    remove_partial_checkpoints(run_dir)  # once the launch may continue or replace the run there
    if resume and not checkpoint_files(run_dir) and finished_without_checkpoints(run_dir) is None:
        kept = set_aside_orphan_log(run_dir)
        if kept is not None:
            log.warning("train.resume=true but %s has no checkpoint: the run starts from step 0, and the log of "
                        "the attempt before is kept as %s", run_dir, kept)


@contextlib.contextmanager
def locked_run_directory(run_dir: Path, resume: bool, overwrite: bool, ctx: DistributedContext):
    """Rank 0 locks ``run_dir`` for the run's lifetime and checks it (``prepare_run_dir``); every rank stops alike
    when the directory cannot be used. Yields the lock (held by rank 0 only)."""
    lock = RunDirectoryLock(run_dir)
    problem = None
    if ctx.is_main:
        try:
            lock.acquire()
            prepare_run_dir(run_dir, resume=resume, overwrite=overwrite)
        except RunDirectoryError as err:
            problem = err
    problems = [err for err in all_gather_objects(problem, ctx) if err is not None]
    try:
        if problems:
            raise problems[0]  # of its kind (in use, taken), which a sweep tells apart from a failed point
        yield lock
    finally:
        lock.release()


class WritableRunDirectory(Callback):
    """Hydra callback (configs/config.yaml): before Hydra creates the run or sweep directory and opens its log
    file there, check that it can, and stop with one line if not (Hydra's own failure is a traceback)."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        refuse_unwritable_directory(config, "hydra.run.dir")

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        refuse_unwritable_directory(config, "hydra.sweep.dir")

    def on_job_start(self, config: DictConfig, **kwargs) -> None:
        stop_on_log_file_errors()
        hold_job_log()


class LogFileWriteError(ValueError):
    """The job log (train.log) could not be written; the message says why and how to go on."""


def stop_on_log_file_errors() -> None:
    """Make a failed write to the job log files (a full disk) stop the run with one line, where ``logging`` would
    print a traceback for every line it cannot write and train on."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = lambda record, handler=handler: log_file_failed(handler, record)


class HeldLines(logging.Filter):
    """On the job log's handler until the launch takes its run directory over: keeps the lines back."""

    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


def held_job_logs() -> list[tuple[logging.FileHandler, HeldLines]]:
    return [(handler, held) for handler in logging.getLogger().handlers if isinstance(handler, logging.FileHandler)
            for held in handler.filters if isinstance(held, HeldLines)]


def hold_job_log() -> None:
    """Keep the job log's lines (train.log, in the run directory) back until the launch takes the directory over
    (``write_held_job_log``) or finds it another run's (``drop_held_job_log``): a launch refused for a directory
    that holds another run, or a resume with nothing to do, leaves that run's log as it was. The console shows
    every line as it comes."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.addFilter(HeldLines())


def write_held_job_log() -> None:
    """The launch took its run directory over (or the directory held no other run): write the lines held back,
    and every line from here on."""
    for handler, held in held_job_logs():
        handler.removeFilter(held)
        for record in held.records:
            handler.handle(record)


def drop_held_job_log() -> None:
    """The run directory is another run's: nothing of this launch goes into its log, not even the lines a sweep's
    launcher logs before its next point."""
    for handler, _ in held_job_logs():
        logging.getLogger().removeHandler(handler)
        handler.close()


def log_file_failed(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    """Drop ``handler`` (the lines after this one go to the console only) and raise :class:`LogFileWriteError`."""
    err = sys.exc_info()[1]
    if not isinstance(err, OSError):  # a bad format string, say: logging's own report
        logging.FileHandler.handleError(handler, record)
        return
    logging.getLogger().removeHandler(handler)
    with contextlib.suppress(OSError):  # closing flushes what is still buffered, into the same full disk
        handler.close()
    raise LogFileWriteError(f"could not write the job log {handler.baseFilename} ({err.strerror or err}): free "
                            "space or fix the directory, then resume with train.resume=true (the checkpoints are "
                            "intact)")


def refuse_unwritable_directory(config: DictConfig, key: str) -> None:
    """Create the directory ``key`` names and a file in it (the job log, which Hydra opens next), or exit."""
    try:
        directory = Path(OmegaConf.select(config, key))
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / HYDRA_LOG, "a"):
            pass
    except Exception as err:  # an OSError, or one met resolving the default directory (unique_run_dir)
        causes = [err]
        while causes[-1].__cause__ or causes[-1].__context__:
            causes.append(causes[-1].__cause__ or causes[-1].__context__)
        unwritable = next((cause for cause in causes if isinstance(cause, OSError)), None)
        if unwritable is not None:
            stop_with_message(f"error: cannot write the run directory {Path(unwritable.filename).absolute()} "
                              f"({unwritable.strerror}): set {key} to a writable directory, or fix the permissions "
                              "(or space) of this one", every_rank_meets_it=True)
        refused = next((cause for cause in causes if isinstance(cause, RunDirectoryError)), None)
        if refused is not None:
            # The default directory refused (torchrun without --rdzv-id): every rank resolves it alike. Stopped
            # here, or Hydra would only warn of it and fail again, with a traceback, creating the directory.
            stop_with_message(f"error: {refused}", every_rank_meets_it=True)
        raise


def write_hydra_record(run_dir: Path, cfg: DictConfig) -> None:
    """What Hydra writes to .hydra/ (config, Hydra's own config, command-line overrides), written once the
    run owns the directory (Hydra's own copy is off: configs/config.yaml sets hydra.output_subdir to null)."""
    record = Path(run_dir) / ".hydra"
    hydra_root = HydraConfig.instance().cfg  # {"hydra": ...}, as Hydra saves it
    try:
        record.mkdir(parents=True, exist_ok=True)
        for name, content in (("config.yaml", cfg), ("hydra.yaml", hydra_root),
                              ("overrides.yaml", hydra_root.hydra.overrides.task)):
            (record / name).write_text(OmegaConf.to_yaml(content))
    except OSError as err:
        raise RunDirectoryError(f"cannot write the run's record of its config to {record} ({err.strerror or err}): "
                                "free space or fix the directory, then start the run again") from None
