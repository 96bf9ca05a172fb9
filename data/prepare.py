"""Turn a text corpus into token shards: OpenWebText, FineWeb-Edu, or your own files.

    python -m data.prepare openwebtext                          # ~9B tokens, ~18 GB of shards
    python -m data.prepare fineweb-edu --sample sample-10BT     # ~10B tokens, ~20 GB
    python -m data.prepare files notes.txt more.jsonl --out ~/data/mine   # .txt, .jsonl/.json, .parquet

Every source takes the same path; only the ``datasets.load_dataset`` call differs. Documents are streamed in
their stored order (the full corpus never has to be on disk before tokenizing), tokenized in that order by a
pool of workers with GPT-2's encoding, each document *preceded* by ``<|endoftext|>`` (llm.c's convention),
and cut into shards of ``--shard-size`` tokens in the llm.c format (``data/shards.py``); a document may span
two shards. The first documents, up to ``--val-tokens`` tokens (whole documents), are the held-out
validation split ``val_000000.bin, ...``; the rest is ``train_000000.bin, ...``. A ``.txt`` file is one
document; a ``.jsonl``/``.json``/``.parquet`` file holds one document per row in ``--text-column``.

``manifest.json`` records the source, tokenizer, vocabulary size, token counts, the largest token id and every
shard together with where the next shard starts (document index, token offset). It is rewritten after each
shard, so an interrupted run continues after its last finished shard when rerun with the same arguments:
the output depends only on the input order and the settings, never on the number of workers.
"""
import argparse
import itertools
import logging
import multiprocessing
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from datasets import load_dataset
from tqdm import tqdm

from data.corpora import FINEWEB_EDU_SAMPLES, HUB_CORPORA, HubCorpus, default_directory
from data.shards import ShardError, read_manifest, read_shard, write_manifest, write_shard
from data.tokenizer import GPT2_EOT_TOKEN, GPT2_VOCAB_SIZE, gpt2_encoding

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 100_000_000  # tokens per shard, as llm.c: 200 MB of uint16
DEFAULT_VAL_TOKENS = 10_000_000
FILE_FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SPLITS = ("val", "train")  # in stream order: validation documents come first
# What the output depends on; a rerun into the same directory must match these to resume.
SETTINGS_KEYS = ("source", "tokenizer", "vocab_size", "eot_token", "document_separator", "shard_size",
                 "val_tokens")


def hub_source(corpus: HubCorpus) -> dict:
    return {"hub": corpus.path, "config": corpus.config, "text_column": corpus.text_column}


def files_source(paths: list[Path], text_column: str = "text") -> dict:
    """Describe local files as a source; each file's size is recorded so that a changed file is noticed."""
    if not paths:
        raise ValueError("no input files given")
    formats = set()
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"input file {path} does not exist")
        if path.suffix not in FILE_FORMATS:
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FILE_FORMATS)}")
        formats.add(FILE_FORMATS[path.suffix])
    if len(formats) > 1:
        raise ValueError(f"input files mix formats {sorted(formats)}: prepare one format per run")
    files = [{"path": str(path.resolve()), "bytes": path.stat().st_size} for path in paths]
    return {"files": files, "format": formats.pop(), "text_column": text_column}


def load_documents(source: dict) -> Iterator[str]:
    """The documents of ``source`` as strings, in their stored order, streamed."""
    if "hub" in source:
        try:
            dataset = load_dataset(source["hub"], name=source["config"], split="train", streaming=True)
        except RuntimeError as err:
            if "scripts are no longer supported" not in str(err):
                raise
            # datasets >= 4 refuses Hub repositories that still load through a Python script.
            raise ValueError(
                f"{source['hub']} on the Hub still loads through a dataset script, which datasets >= 4 cannot "
                "run: download its data files yourself and use `python -m data.prepare files FILES... --out DIR`"
            ) from None
    else:
        text_options = {"sample_by": "document", "keep_linebreaks": True} if source["format"] == "text" else {}
        dataset = load_dataset(source["format"], data_files=[f["path"] for f in source["files"]], split="train",
                               streaming=True, **text_options)
    column = source["text_column"]
    for row in dataset:
        if column not in row:
            raise ValueError(f"the documents have no column {column!r} (they have {sorted(row)}): "
                             "pass --text-column")
        yield row[column]


def tokenize_document(text: str) -> np.ndarray:
    tokens = [GPT2_EOT_TOKEN]
    tokens.extend(gpt2_encoding().encode_ordinary(text))
    return np.array(tokens, dtype=np.uint16)


def tokenize_documents(texts: Iterable[str], workers: int) -> Iterator[np.ndarray]:
    """Token arrays in document order, whatever the number of workers."""
    if workers == 1:
        yield from map(tokenize_document, texts)
        return
    with multiprocessing.Pool(workers) as pool:
        yield from pool.imap(tokenize_document, texts, chunksize=16)


class ShardWriter:
    """Cuts the document stream into val then train shards and records each one in the manifest."""

    def __init__(self, out: Path, manifest: dict) -> None:
        self.out, self.manifest = out, manifest
        self.shard_size, self.val_tokens = manifest["shard_size"], manifest["val_tokens"]
        shards = manifest["shards"]
        self.split = shards[-1]["split"] if shards else None
        self.val_assigned = sum(s["tokens"] for s in shards if s["split"] == "val")
        self.next_document, self.next_offset = (
            (shards[-1]["next_document"], shards[-1]["next_offset"]) if shards else (0, 0)
        )
        self.buffer: list[np.ndarray] = []
        self.buffered = 0

    def add(self, document: int, tokens: np.ndarray, offset: int = 0) -> None:
        """Append document ``document``'s tokens from token ``offset`` on (non-zero only when resuming)."""
        if offset == 0:
            split = "val" if self.val_assigned < self.val_tokens else "train"
            if split != self.split:
                self._write(end=(document, 0))
                self.split = split
        if self.split == "val":
            self.val_assigned += len(tokens)
        end_of_document = offset + len(tokens)
        position = offset
        while position < end_of_document:
            take = min(self.shard_size - self.buffered, end_of_document - position)
            self.buffer.append(tokens[position - offset : position - offset + take])
            self.buffered += take
            position += take
            if self.buffered == self.shard_size:
                self._write(end=(document, position) if position < end_of_document else (document + 1, 0))
        self.next_document = document + 1

    def finish(self) -> None:
        self._write(end=(self.next_document, 0))

    def _write(self, end: tuple[int, int]) -> None:
        if not self.buffered:
            return
        tokens = np.concatenate(self.buffer)
        index = sum(1 for s in self.manifest["shards"] if s["split"] == self.split)
        name = f"{self.split}_{index:06d}.bin"
        write_shard(self.out / name, tokens)
        self.manifest["shards"].append({"file": name, "split": self.split, "tokens": int(tokens.size),
                                        "max_token_id": int(tokens.max()), "next_document": end[0],
                                        "next_offset": end[1]})
        write_manifest(self.out, self.manifest)
        self.buffer, self.buffered = [], 0


def _finished_shards(out: Path, shards: list[dict]) -> list[dict]:
    """The recorded shards up to the first one that is missing or damaged on disk."""
    for k, shard in enumerate(shards):
        try:
            intact = len(read_shard(out / shard["file"])) == shard["tokens"]
        except ShardError:
            intact = False
        if not intact:
            log.warning("%s is missing or damaged: preparing again from there", out / shard["file"])
            return shards[:k]
    return shards


def _start_or_resume(out: Path, settings: dict) -> dict:
    """The manifest to continue from: a fresh one, or the one of an interrupted run with the same settings."""
    manifest = read_manifest(out) if out.is_dir() else None
    if manifest is None:
        if out.is_dir() and any(out.glob("*.bin")):
            raise ValueError(f"{out} holds .bin files but no manifest.json, so it was not made by this script: "
                             "choose an empty or new --out directory")
        out.mkdir(parents=True, exist_ok=True)
        return {**settings, "complete": False, "shards": []}
    differing = [key for key in SETTINGS_KEYS if manifest.get(key) != settings[key]]
    if differing:
        raise ValueError(f"{out} was prepared with different {', '.join(differing)} ({manifest.get('command')}): "
                         "rerun that command to finish it, or delete the directory / choose another --out")
    if not manifest.get("complete"):
        manifest["shards"] = _finished_shards(out, manifest["shards"])
    return manifest


def prepare(source: dict, out: str | os.PathLike, *, shard_size: int = DEFAULT_SHARD_SIZE,
            val_tokens: int = DEFAULT_VAL_TOKENS, workers: int | None = None, command: str = "") -> dict:
    """Tokenize ``source`` into shards under ``out`` (resuming an interrupted run); returns the manifest."""
    if shard_size <= 0 or val_tokens <= 0:
        raise ValueError(f"--shard-size ({shard_size}) and --val-tokens ({val_tokens}) must be positive")
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    out = Path(out).expanduser()
    settings = {"source": source, "tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "eot_token": GPT2_EOT_TOKEN,
                "document_separator": "<|endoftext|> before each document", "shard_size": shard_size,
                "val_tokens": val_tokens}
    manifest = _start_or_resume(out, settings)
    if manifest["complete"]:
        log.info("%s is already prepared (%s)", out, manifest["tokens"])
        return manifest
    manifest["command"] = command or manifest.get("command", "")
    writer = ShardWriter(out, manifest)
    start_document, start_offset = writer.next_document, writer.next_offset
    if manifest["shards"]:
        log.info("resuming %s after %d finished shards, at document %d", out, len(manifest["shards"]),
                 start_document)
    done_tokens = sum(s["tokens"] for s in manifest["shards"])
    started = time.perf_counter()
    new_tokens = 0
    texts = itertools.islice(load_documents(source), start_document, None)
    with tqdm(desc=f"tokenizing into {out}", unit="tok", unit_scale=True, initial=done_tokens) as progress:
        for document, tokens in enumerate(tokenize_documents(texts, workers), start=start_document):
            offset = start_offset if document == start_document else 0
            writer.add(document, tokens[offset:], offset)
            new_tokens += len(tokens) - offset
            progress.update(len(tokens) - offset)
    writer.finish()
    seconds = time.perf_counter() - started
    _complete(out, manifest, writer.next_document)
    log.info("%s: %s tokens in %d shards; tokenized %d tokens in %.1f s (%.0f tokens/s, %.0f per worker)",
             out, manifest["tokens"], len(manifest["shards"]), new_tokens, seconds, new_tokens / seconds,
             new_tokens / seconds / workers)
    return manifest


def _complete(out: Path, manifest: dict, documents: int) -> None:
    tokens = {split: sum(s["tokens"] for s in manifest["shards"] if s["split"] == split) for split in SPLITS}
    if not tokens["train"]:
        raise ValueError(f"the corpus has only {tokens['val']} tokens, all held out for validation "
                         f"(--val-tokens {manifest['val_tokens']}): delete {out} and lower --val-tokens")
    manifest.update(complete=True, documents=documents, tokens=tokens,
                    max_token_id=max(s["max_token_id"] for s in manifest["shards"]))
    write_manifest(out, manifest)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, help="output directory (default for hub corpora: under "
                                                 "$MARS_DATA_CACHE or ~/.cache/mars-gpt2, where data=<name> looks)")
    common.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, help="tokens per shard")
    common.add_argument("--val-tokens", type=int, default=DEFAULT_VAL_TOKENS,
                        help="tokens (whole documents, from the start) held out as the validation split")
    common.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: all cores)")
    parser = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    sources = parser.add_subparsers(dest="source", required=True)
    sources.add_parser("openwebtext", parents=[common], help="Skylion007/openwebtext (~9B tokens)")
    fineweb = sources.add_parser("fineweb-edu", parents=[common], help="HuggingFaceFW/fineweb-edu, one sample")
    fineweb.add_argument("--sample", choices=FINEWEB_EDU_SAMPLES, default=HUB_CORPORA["fineweb-edu"].config)
    files = sources.add_parser("files", parents=[common], help="local .txt, .jsonl/.json or .parquet files")
    files.add_argument("paths", nargs="+", type=Path)
    files.add_argument("--text-column", default="text", help="the column holding the text (.jsonl/.parquet)")
    return parser


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    try:
        if args.source == "files":
            if args.out is None:
                raise ValueError("files needs --out DIR: the directory to write the shards to")
            source, out = files_source(args.paths, args.text_column), args.out
        else:
            corpus = HUB_CORPORA[args.source]
            if args.source == "fineweb-edu":
                corpus = replace(corpus, config=args.sample)
            source, out = hub_source(corpus), args.out or default_directory(corpus)
        prepare(source, out, shard_size=args.shard_size, val_tokens=args.val_tokens, workers=args.workers,
                command=shlex.join(["python", "-m", "data.prepare", *argv]))
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
