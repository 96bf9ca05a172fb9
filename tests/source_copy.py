"""A copy of the repository's source files, for tests that run a changed or git-less checkout of the code."""
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def copy_source_tree(destination: Path) -> Path:
    """Copy the files git tracks or would track (not .git, a virtual environment or build output) to
    ``destination``: copying the whole folder would copy the venv that CI makes inside the clone (gigabytes)."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not in the copy either
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination
