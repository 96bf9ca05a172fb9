"""One process at a time writes a shard directory; the others wait for it, then find the directory complete.

Every rank of a torchrun launch, and every launch of a sweep, may find the embedded corpus' cache empty at once,
and two ``data.prepare`` jobs may be given one ``--out``. The writer holds ``flock`` on ``<directory>.lock`` beside
the directory (outside it: ``data.prepare --overwrite`` renames the directory), dropped by the kernel however the
process ends and, on NFS, seen by every host; it removes the file as it finishes. Where the file system has no
locks (some Lustre mounts), or the directory's parent cannot be written, the writers go on together: each writes
its files under a temporary name of its own (``data.shards.write_atomically``), so every file is whole all the same.
Also here: the names given beside a directory, within the file system's limit on a name.
"""
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import socket
from pathlib import Path
from typing import Iterator, TextIO

log = logging.getLogger(__name__)

LOCK_SUFFIX = ".lock"
# errno of a file system without flock: the writers go on unprotected rather than not at all (the run directory's
# lock too: training/run_dir.py)
LOCKS_UNSUPPORTED = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
# errno of a parent this process may not write: the lock cannot be made, the directory may still be writable
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)
DEFAULT_NAME_MAX = 255  # bytes, where the file system does not say (ext4, XFS, Btrfs, NFS, Lustre)


@contextlib.contextmanager
def sole_writer(directory: Path) -> Iterator[bool]:
    """Hold the lock of ``directory``'s writer for the ``with`` block, waiting (and saying so) while another
    process holds it; the parent is created if need be. Yields whether this process is the only writer (False
    where the lock cannot be had: see the module's docstring)."""
    path = beside(directory, LOCK_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = _acquire(path, directory)
    try:
        yield lock is not None
    finally:
        if lock is not None:
            with contextlib.suppress(OSError):  # a removal refused: the next writer locks the file as it is
                if _names(lock, path):
                    path.unlink()
            lock.close()  # drops the flock; a waiter finds its file gone and locks the one the path names then


def _acquire(path: Path, directory: Path) -> TextIO | None:
    """The lock file ``path`` of ``directory`` opened and locked, after any holder let go; None where it cannot be
    (see ``sole_writer``)."""
    while True:
        try:
            lock = open(path, "a+")
        except OSError as err:
            if err.errno not in READ_ONLY:
                raise
            log.warning("cannot create %s (%s): another process writing %s at the same time would write beside "
                        "this one", path, err.strerror, directory)
            return None
        try:
            _lock(lock, directory)
        except OSError as err:
            lock.close()
            if err.errno not in LOCKS_UNSUPPORTED:
                raise
            log.warning("the file system of %s has no locks (%s): another process writing it at the same time "
                        "would write beside this one", directory, err)
            return None
        except BaseException:  # Ctrl-C while waiting
            lock.close()
            raise
        if _names(lock, path):
            lock.truncate(0)
            lock.write(f"host {socket.gethostname()}, pid {os.getpid()}\n")
            lock.flush()
            return lock
        lock.close()  # the holder removed the file as it finished: lock the one the path names now


def _lock(lock: TextIO, directory: Path) -> None:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        log.info("waiting for %s, which %s is writing", directory, holder)
        fcntl.flock(lock, fcntl.LOCK_EX)


def _names(lock: TextIO, path: Path) -> bool:
    """Whether ``path`` still names the open ``lock`` (not removed, not replaced)."""
    try:
        return os.path.samestat(os.fstat(lock.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


def beside(directory: Path, suffix: str) -> Path:
    """``directory`` with ``suffix`` added to its name, in the same parent: where the name would pass the file
    system's limit (255 bytes mostly), its end gives way to a hash of the whole name, so that two long names
    stay apart and the same name always gets the same path."""
    name = os.fsencode(directory.name)
    limit = longest_name(directory.parent)
    if len(name) + len(suffix) <= limit:
        return directory.with_name(directory.name + suffix)
    digest = "-" + hashlib.sha256(name).hexdigest()[:16]
    kept = name[: limit - len(suffix) - len(digest)].decode("utf-8", "ignore")  # no character cut in two
    return directory.with_name(kept + digest + suffix)


def longest_name(parent: Path) -> int:
    """The longest name, in bytes, that the file system of ``parent`` (or of its nearest existing ancestor) takes."""
    for folder in (parent, *parent.parents):
        try:
            return os.pathconf(folder, "PC_NAME_MAX")
        except OSError:  # not there yet
            continue
    return DEFAULT_NAME_MAX
