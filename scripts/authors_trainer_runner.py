"""Run one of the MARS authors' trainer files as they ship it, but for named text patches, recording what it logs.

    python scripts/authors_trainer_runner.py --patches PATCHES.json --record RECORD.jsonl TRAINER.py [ARGS ...]

Run as a file, not with ``-m``: their trainer imports its neighbours (``from model import GPT``,
``from optimizers.mars import MARS``), which must resolve to their files, not to this repository's packages. So
the trainer's folder heads ``sys.path`` and nothing of this repository is imported here.

``PATCHES.json`` lists the patches, each ``{"name", "file", "old", "new"}``: in ``file`` (the trainer itself, or a
module it imports) the text ``old``, which must occur exactly once, becomes ``new``. A patch whose ``old`` text
is not there (or not once) stops the run before anything trains, naming the patch: a patch that no longer
applies is never skipped silently.

Their trainers log through wandb (their configs set ``wandb_log = True``); a stand-in ``wandb`` module records
every ``wandb.log`` call, full precision, as one JSON line of ``RECORD.jsonl`` (``{"step": ..., key: value}``),
and the trainer's final ``best_val_loss`` as the last line (``{"best_val_loss": ...}``). Nothing goes online.
"""
import argparse
import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path


class PatchError(Exception):
    """A patch that does not apply to the text it names."""


def apply_patches(path: Path, source: str, patches: list[dict]) -> str:
    """``source`` (the text of ``path``) with every patch for ``path`` applied; each must match exactly once."""
    for patch in patches:
        if Path(patch["file"]).resolve() != path.resolve():
            continue
        count = source.count(patch["old"])
        if count != 1:
            found = "is not there" if count == 0 else f"occurs {count} times"
            raise PatchError(f"patch '{patch['name']}' no longer applies to {path}: its text {patch['old']!r} "
                             f"{found}; update the patch for this version of their code")
        source = source.replace(patch["old"], patch["new"])
    return source


def check_patches(patches: list[dict]) -> None:
    """Every patch applies to its file: checked before the trainer starts, so none is found stale mid-run."""
    for path in {Path(patch["file"]) for patch in patches}:
        if not path.is_file():
            names = ", ".join(patch["name"] for patch in patches if Path(patch["file"]) == path)
            raise PatchError(f"patch '{names}' names {path}, which does not exist in their checkout")
        apply_patches(path, path.read_text(), patches)


class PatchedSourceLoader(importlib.machinery.SourceFileLoader):
    """Loads a module from its file with the patches applied (compiled from the text: no cached bytecode)."""

    def __init__(self, fullname: str, path: str, patches: list[dict]) -> None:
        super().__init__(fullname, path)
        self.patches = patches

    def get_code(self, fullname):
        return compile(apply_patches(Path(self.path), Path(self.path).read_text(), self.patches), self.path, "exec")


class PatchedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds modules as the path finder does; those in a patched file get a ``PatchedSourceLoader``."""

    def __init__(self, patches: list[dict]) -> None:
        self.patches = patches
        self.patched_files = {Path(patch["file"]).resolve() for patch in patches}

    def find_spec(self, fullname, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None or Path(spec.origin).resolve() not in self.patched_files:
            return None
        return importlib.util.spec_from_file_location(
            fullname, spec.origin, loader=PatchedSourceLoader(fullname, spec.origin, self.patches))


def plain_number(value):
    """A logged value as JSON holds it: 0-d tensors and numpy scalars as Python numbers."""
    return value.item() if hasattr(value, "item") else value


def recording_wandb(record_path: Path) -> types.ModuleType:
    """A ``wandb`` module whose ``log`` appends each call to ``record_path``; ``init`` does nothing."""
    wandb = types.ModuleType("wandb")

    def log(data: dict, step=None, **_) -> None:
        with open(record_path, "a") as f:
            f.write(json.dumps({"step": step, **{key: plain_number(value) for key, value in data.items()}}) + "\n")
    wandb.init = lambda *args, **kwargs: None
    wandb.log = log
    return wandb


def run_trainer(trainer: Path, args: list[str], patches: list[dict], record_path: Path) -> None:
    """Execute ``trainer`` as ``__main__`` with ``args``, patched, logging into ``record_path``."""
    check_patches(patches)
    sys.argv = [str(trainer), *args]
    sys.path[0] = str(trainer.parent)  # as `python TRAINER.py` would have it
    sys.meta_path.insert(0, PatchedModuleFinder(patches))
    sys.modules["wandb"] = recording_wandb(record_path)
    namespace = {"__name__": "__main__", "__file__": str(trainer), "__builtins__": builtins}
    code = compile(apply_patches(trainer, trainer.read_text(), patches), str(trainer), "exec")
    exec(code, namespace)
    with open(record_path, "a") as f:
        f.write(json.dumps({"best_val_loss": plain_number(namespace["best_val_loss"])}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--patches", type=Path, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("trainer", type=Path)
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args()
    try:
        run_trainer(options.trainer.resolve(), options.args, json.loads(options.patches.read_text()),
                    options.record)
    except PatchError as err:
        raise SystemExit(str(err)) from None


if __name__ == "__main__":
    main()
