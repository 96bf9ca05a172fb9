"""Files replaced atomically: a reader (or a resume after a crash) sees the old content or the new, never a part."""
import contextlib
import os
import shutil
from pathlib import Path

TEMPORARY_SUFFIX = ".tmp"  # a file being written: what a killed write leaves behind


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w"):
    """Yield ``path.tmp`` open for writing; when the block ends it is flushed, fsynced and renamed onto ``path``.

    If the block raises (a full disk, a kill signal turned exception), the temporary file is removed and ``path``
    is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(path.name + TEMPORARY_SUFFIX)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_directory(path: Path):
    """Yield a new directory beside ``path`` to write files into; when the block ends they are moved to ``path``:
    by one rename where ``path`` does not exist (it appears whole), else file by file (each replaced whole; the
    files of ``path`` that the block did not write are kept).

    If the block raises (a full disk, Ctrl-C), the directory is removed and ``path`` is left as it was.
    """
    path = Path(path)
    staging = path.with_name(f".{path.name}.{os.getpid()}{TEMPORARY_SUFFIX}")
    shutil.rmtree(staging, ignore_errors=True)  # what a killed process of the same pid left
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        yield staging
        if path.exists():
            for written in staging.iterdir():
                os.replace(written, path / written.name)
            staging.rmdir()
        else:
            os.rename(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
