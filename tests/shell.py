"""A shell as a user opens one beside the terminal that ran a command: what the printed commands must run in."""
import os
import sys
from pathlib import Path


def shell_without_the_venv() -> dict:
    """A fresh shell's environment, as a terminal opened beside the one that ran train.py has it: no virtual
    environment activated (nor its directory on PATH), nothing of this process's Python settings."""
    venv = Path(sys.prefix)
    path = [entry for entry in os.environ.get("PATH", "").split(os.pathsep)
            if entry and not Path(entry).resolve().is_relative_to(venv.resolve())]
    return {"PATH": os.pathsep.join(path), "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8"}
