"""Runs one of the MARS authors' trainer files as ``__main__``, after named exact-string replacements in its source.

    python scripts/authors_trainer_runner.py TRAINER PATCHES_JSON -- TRAINER_ARGS...

Run as a file, not a module, so that nothing of this repository is importable: their trainers import ``model``
from their own folder, which is put first on the path. ``PATCHES_JSON`` is a list of ``[name, old, new]``; each
``old`` must occur in the source, or the run stops naming the patch, so that a patch which no longer applies is
never skipped.
"""
import json
import sys
from pathlib import Path


class PatchDoesNotApply(SystemExit):
    pass


def patched_source(source: str, patches: list[list[str]]) -> str:
    for name, old, new in patches:
        if old not in source:
            raise PatchDoesNotApply(f"patch {name!r} does not apply: its text is not in the trainer file")
        source = source.replace(old, new)
    return source


def main(argv: list[str]) -> None:
    trainer, patches_json, separator, *trainer_args = argv
    assert separator == "--", "usage: TRAINER PATCHES_JSON -- TRAINER_ARGS..."
    trainer = Path(trainer).resolve()
    source = patched_source(trainer.read_text(encoding="utf-8"), json.loads(patches_json))
    sys.path[0] = str(trainer.parent)
    sys.argv = [str(trainer), *trainer_args]
    exec(compile(source, str(trainer), "exec"), {"__name__": "__main__", "__file__": str(trainer)})


if __name__ == "__main__":
    main(sys.argv[1:])
