"""Files replaced atomically: a reader (or a resume after a crash) sees the old content or the new, never a part."""
import contextlib
import os
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
