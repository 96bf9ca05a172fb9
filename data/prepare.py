"""Turn a text corpus into token shards: OpenWebText, FineWeb-Edu, or your own files.

    python -m data.prepare openwebtext                          # ~9B tokens, ~18 GB of shards
    python -m data.prepare fineweb-edu --sample sample-10BT     # ~10B tokens, ~20 GB
    python -m data.prepare files notes.txt more.jsonl --out ~/data/mine   # .txt, .jsonl/.json, .parquet
    python -m data.prepare c4                                   # t5-base rows as GaLore's (data/c4.py)

Every source takes the same path; only the ``datasets.load_dataset`` call differs. Documents are streamed in
their stored order (the full corpus never has to be on disk before tokenizing), tokenized by a pool of workers
with GPT-2's encoding (``encode_ordinary``: a literal ``<|endoftext|>`` in a text is ordinary text) and cut into
shards of ``--shard-size`` tokens in the llm.c format (``data/shards.py``), ``val_000000.bin, ...`` and
``train_000000.bin, ...``; a document may span two shards. A ``.txt`` file is one document; a
``.jsonl``/``.json``/``.parquet`` file holds one document per row in ``--text-column``.

``--split`` names the rule that makes the validation split; each Hub corpus defaults to the preparation the MARS
authors evaluated on, so that validation losses are comparable with the paper's:

- ``nanogpt`` (openwebtext; nanoGPT's ``data/openwebtext/prepare.py``): ``<|endoftext|>`` *after* each document;
  ``datasets``' ``train_test_split(test_size=0.0005, seed=2357, shuffle=True)`` over all documents picks the
  validation documents, written in the split's (shuffled) order, exactly nanoGPT's ``val.bin``. The permutation
  depends only on the number of documents, so it is computed by ``datasets`` on a stand-in of that length: the
  stream yields the rows in the order a map-style ``load_dataset`` stores them (both read the same data files in
  the same order), and the stream is checked to hold exactly that many documents. The train documents are
  nanoGPT's too, but in stream order, not in its shuffled order: a stream cannot be permuted without holding it,
  and random-window sampling makes the order irrelevant to training.
- ``llm.c`` (fineweb-edu; llm.c's ``dev/data/fineweb.py``, read by the MARS authors' FineWeb-Edu trainer):
  ``<|endoftext|>`` *before* each document; the first ``--val-tokens`` tokens of the stream (default 100M, llm.c's
  shard size), the last document cut there, are the validation split, the rest is train. With the default sizes
  ``val_000000.bin`` is byte for byte llm.c's shard 0 (``edu_fineweb_val_000000.bin``, which the MARS trainer
  reads as ``fineweb_val_000000.bin``) and ``train_{k:06d}.bin`` its shard ``k + 1``.
- ``first-documents`` (files): ``<|endoftext|>`` before each document; the first whole documents, until they
  reach ``--val-tokens`` tokens (default 10M), are the validation split, the rest is train.

``manifest.json`` records the source, tokenizer, vocabulary size, the split rule, token counts, the largest token
id and every shard together with where the next shard starts (document position in the output order, token
offset). It is rewritten after each shard, so an interrupted run continues after its last finished shard when
rerun with the same arguments: the output depends only on the input order and the settings, never on the number
of workers. ``--overwrite`` prepares anew beside ``--out`` and puts the finished corpus in its place: until then
the old corpus stays whole, and no old shard is left among the new ones (a run reading the old one reads it to its
end). One process prepares an ``--out`` at a time (``data/writer_lock.py``): a second one waits for the first.
"""
import argparse
import bisect
import errno
import functools
import json
import logging
import multiprocessing
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
from tqdm import tqdm

from configs.schema import TrainConfig
from data import c4
from data.corpora import FINEWEB_EDU_SAMPLES, HUB_CORPORA, HubCorpus, default_directory, unwritable_cache
from data.shards import ShardError, read_manifest, read_shard, remove_temporaries, write_manifest, write_shard
from data.tokenizer import GPT2_EOT_TOKEN, GPT2_VOCAB_SIZE, gpt2_encoding
from data.writer_lock import beside, longest_name, sole_writer

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 100_000_000  # tokens per shard, as llm.c: 200 MB of uint16
FILE_FORMATS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
SPLITS = ("val", "train")
# What the output depends on; a rerun into the same directory must match these to resume.
SETTINGS_KEYS = ("source", "tokenizer", "vocab_size", "eot_token", "document_separator", "split", "shard_size",
                 "tokenizer_fingerprint", "rows")  # the last two: C4's only (data/c4.py)
# The fewest tokens a split needs for the trainer's defaults: one batch of train.batch_size windows of
# train.block_size tokens and the target after them.
DEFAULT_BATCH_TOKENS = TrainConfig.batch_size * TrainConfig.block_size + 1
DEFAULT_BATCH = f"train.batch_size {TrainConfig.batch_size} x train.block_size {TrainConfig.block_size} + 1"
# Where --overwrite prepares before the result replaces --out, and where the replaced corpus goes until deleted
# (beside --out, named by ``beside`` within the file system's limit on a name).
OVERWRITING_SUFFIX, REPLACED_SUFFIX = ".overwriting", ".replaced"


@dataclass(frozen=True)
class FirstDocuments:
    """The first whole documents, until they reach ``val_tokens`` tokens, are val; ``<|endoftext|>`` before each."""

    val_tokens: int = 10_000_000
    name = "first-documents"
    eot_first = True
    documents = None  # the order is the stream's, whatever its length

    def settings(self) -> dict:
        return {"rule": self.name, "val_tokens": self.val_tokens,
                "description": f"first whole documents up to {self.val_tokens:,} tokens, EOT prepended"}

    def position(self, index: int) -> int:
        return index

    def route(self, writer: "ShardWriter", document: int, tokens: np.ndarray, start: int) -> None:
        # A document resumed in its middle stays in the split it started in.
        if start == 0:
            split = "val" if writer.tokens["val"] < self.val_tokens else "train"
        else:
            split = writer.split
        writer.add(split, document, tokens, start)


@dataclass(frozen=True)
class LlmcSplit(FirstDocuments):
    """llm.c's dev/data/fineweb.py: the first ``val_tokens`` tokens are val, the document there cut in two."""

    val_tokens: int = DEFAULT_SHARD_SIZE
    name = "llm.c"

    def settings(self) -> dict:
        return {"rule": self.name, "val_tokens": self.val_tokens,
                "description": f"llm.c: first {self.val_tokens:,} tokens (last document cut), EOT prepended"}

    def route(self, writer: "ShardWriter", document: int, tokens: np.ndarray, start: int) -> None:
        cut = start + min(len(tokens) - start, max(0, self.val_tokens - writer.tokens["val"]))
        if cut > start:
            writer.add("val", document, tokens, start, cut)
        if cut < len(tokens):
            writer.add("train", document, tokens, cut)


@dataclass(frozen=True)
class NanoGPTSplit:
    """nanoGPT's data/openwebtext/prepare.py: ``train_test_split(test_size, seed, shuffle=True)``, EOT appended.

    The output order puts the train documents first, in stream order, then the val documents in the split's
    order: position ``p < train_documents`` is the ``p``-th train document of the stream, position
    ``train_documents + r`` the ``r``-th document of the test split.
    """

    test_size: float = 0.0005
    seed: int = 2357
    documents: int | None = None  # the corpus' document count, which the permutation depends on
    name = "nanogpt"
    eot_first = False

    def settings(self) -> dict:
        return {"rule": self.name, "test_size": self.test_size, "seed": self.seed,
                "description": f"nanogpt: train_test_split(test_size={self.test_size}, seed={self.seed}, "
                               "shuffle=True), EOT appended; val in the split's order, train in stream order"}

    @functools.cached_property
    def val_documents(self) -> list[int]:
        """Stream indices of the val documents in the split's order, as ``datasets`` itself computes them."""
        from datasets import Dataset  # imports pandas and pyarrow: seconds, so only where it is used

        stand_in = Dataset.from_dict({"document": np.arange(self.documents)})
        split = stand_in.train_test_split(test_size=self.test_size, seed=self.seed, shuffle=True)
        return list(split["test"]["document"])

    @functools.cached_property
    def _val_rank(self) -> dict[int, int]:
        return {index: rank for rank, index in enumerate(self.val_documents)}

    @functools.cached_property
    def _sorted_val_documents(self) -> list[int]:
        return sorted(self.val_documents)

    @property
    def train_documents(self) -> int:
        return self.documents - len(self.val_documents)

    def position(self, index: int) -> int:
        if index >= self.documents:
            raise ValueError(f"the source holds more than the {self.documents:,} documents the nanogpt split was "
                             "computed for, so its validation split cannot be nanoGPT's")
        rank = self._val_rank.get(index)
        if rank is not None:
            return self.train_documents + rank
        return index - bisect.bisect_left(self._sorted_val_documents, index)

    def route(self, writer: "ShardWriter", document: int, tokens: np.ndarray, start: int) -> None:
        writer.add("train" if document < self.train_documents else "val", document, tokens, start)


SplitRule = NanoGPTSplit | LlmcSplit | FirstDocuments
SPLIT_RULES = {rule.name: rule for rule in (NanoGPTSplit, LlmcSplit, FirstDocuments)}


def split_rule(name: str, *, val_tokens: int | None = None, test_size: float | None = None) -> SplitRule:
    """The split rule ``name`` with its parameters; the one that does not apply to it must be None."""
    if name not in SPLIT_RULES:
        raise ValueError(f"unknown split rule {name!r}; use one of {', '.join(SPLIT_RULES)}")
    if name == NanoGPTSplit.name:
        if val_tokens is not None:
            raise ValueError("--val-tokens does not apply to the nanogpt split, which holds out --test-size of "
                             "the documents")
        if test_size is None:
            return NanoGPTSplit()
        if not 0 < test_size < 1:
            raise ValueError(f"--test-size must lie in (0, 1), got {test_size}")
        return NanoGPTSplit(test_size=test_size)
    if test_size is not None:
        raise ValueError(f"--test-size applies to the nanogpt split only; the {name} split holds out --val-tokens")
    if val_tokens is None:
        return SPLIT_RULES[name]()
    if val_tokens <= 0:
        raise ValueError(f"--val-tokens must be positive, got {val_tokens}")
    return SPLIT_RULES[name](val_tokens=val_tokens)


def hub_source(corpus: HubCorpus) -> dict:
    return {"hub": corpus.path, "config": corpus.config, "text_column": corpus.text_column}


def files_source(paths: list[Path], text_column: str = "text") -> dict:
    """Describe local files as a source; each file's size is recorded so that a changed file is noticed."""
    if not paths:
        raise ValueError("no input files given")
    formats = set()
    for path in paths:
        if path.is_dir():
            raise ValueError(f"input {path} is a directory: give the files in it, e.g. {path}/*.jsonl (one format "
                             f"per run: {', '.join(FILE_FORMATS)})")
        if not path.is_file():
            raise FileNotFoundError(f"input file {path} does not exist")
        if path.suffix not in FILE_FORMATS:
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FILE_FORMATS)}")
        if path.stat().st_size == 0:
            raise ValueError(f"input file {path} is empty: leave it out, or give the file its documents")
        formats.add(FILE_FORMATS[path.suffix])
    if len(formats) > 1:
        raise ValueError(f"input files mix formats {sorted(formats)}: prepare one format per run")
    files = [{"path": str(path.resolve()), "bytes": path.stat().st_size} for path in paths]
    return {"files": files, "format": formats.pop(), "text_column": text_column}


def load_documents(source: dict) -> Iterator[str]:
    """The documents of ``source`` as strings, in their stored order, streamed."""
    from datasets import load_dataset  # imports pandas and pyarrow: seconds, so only where it is used

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
    skipped, first_skipped = 0, None  # rows without text (a null, a number): left out, counted
    try:
        for number, row in enumerate(dataset, 1):
            if column not in row:
                raise ValueError(f"the documents have no column {column!r} (they have {sorted(row)}): "
                                 "pass --text-column")
            if isinstance(row[column], str):
                yield row[column]
            else:
                skipped += 1
                first_skipped = first_skipped or (number, row[column])
    except (ValueError, RuntimeError) as err:
        if "files" not in source or str(err).startswith("the documents have no column"):
            raise
        # datasets' parse and decode errors name neither the file nor what it should hold
        names = ", ".join(f["path"] for f in source["files"])
        raise ValueError(f"could not read the documents of {names} ({' '.join(str(err).split())[:200]}): each file "
                         f"must be {source['format']} in UTF-8" + (f", one JSON object per line with a {column!r} "
                         "field" if source["format"] == "json" else "")) from None
    if skipped:
        number, value = first_skipped
        log.warning("skipped %d row(s) whose %r is not a string, so holds no document (the first: row %d of the "
                    "input, in the order the files were given, holds %s); they are left out of the corpus",
                    skipped, column, number, json.dumps(value, default=str))


def count_documents(source: dict) -> int:
    log.info("counting the documents (the nanogpt split depends on their number): one extra pass over the corpus")
    return sum(1 for _ in load_documents(source))


def tokenize_document(text: str, eot_first: bool = True) -> np.ndarray:
    """GPT-2 tokens of ``text`` with ``<|endoftext|>`` before (llm.c) or after (nanoGPT) them."""
    tokens = gpt2_encoding().encode_ordinary(text)
    tokens = [GPT2_EOT_TOKEN, *tokens] if eot_first else [*tokens, GPT2_EOT_TOKEN]
    return np.array(tokens, dtype=np.uint16)


def _tokenize_numbered(numbered_text: tuple[int, str], eot_first: bool) -> tuple[int, np.ndarray]:
    number, text = numbered_text
    return number, tokenize_document(text, eot_first)


def tokenize_documents(numbered_texts: Iterable[tuple[int, str]], workers: int,
                       eot_first: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    """(number, token array) pairs in input order, whatever the number of workers."""
    tokenize = functools.partial(_tokenize_numbered, eot_first=eot_first)
    if workers == 1:
        yield from map(tokenize, numbered_texts)
        return
    with multiprocessing.Pool(workers) as pool:
        yield from pool.imap(tokenize, numbered_texts, chunksize=16)


class ShardWriter:
    """Cuts the val and train token streams into shards and records each one in the manifest.

    Positions are (document, token offset) in the output order of the documents; each shard records the
    position of the token after its last one, which is where a resumed run starts.
    """

    def __init__(self, out: Path, manifest: dict) -> None:
        self.out, self.manifest, self.shard_size = out, manifest, manifest["shard_size"]
        # a corpus of rows records each shard's tokens that are not padding (what an evaluation scores)
        self.pad_token = manifest["rows"]["pad_token"] if manifest.get("rows") else None
        shards = manifest["shards"]
        self.split = shards[-1]["split"] if shards else None
        self.tokens = {split: sum(s["tokens"] for s in shards if s["split"] == split) for split in SPLITS}
        self.next_document, self.next_offset = (
            (shards[-1]["next_document"], shards[-1]["next_offset"]) if shards else (0, 0)
        )
        self.buffer: list[np.ndarray] = []
        self.buffered = 0

    def add(self, split: str, document: int, tokens: np.ndarray, start: int = 0, stop: int | None = None) -> None:
        """Append ``tokens[start:stop]`` of document ``document`` (all its tokens) to ``split``."""
        stop = len(tokens) if stop is None else stop
        if split != self.split:
            self._write()  # the other split's last shard ends here
            self.split = split
        position = start
        while position < stop:
            take = min(self.shard_size - self.buffered, stop - position)
            self.buffer.append(tokens[position : position + take])
            self.buffered += take
            self.tokens[split] += take
            position += take
            self.next_document, self.next_offset = (
                (document, position) if position < len(tokens) else (document + 1, 0)
            )
            if self.buffered == self.shard_size:
                self._write()

    def finish(self) -> None:
        self._write()

    def _write(self) -> None:
        if not self.buffered:
            return
        tokens = np.concatenate(self.buffer)
        index = sum(1 for s in self.manifest["shards"] if s["split"] == self.split)
        name = f"{self.split}_{index:06d}.bin"
        write_shard(self.out / name, tokens)
        shard = {"file": name, "split": self.split, "tokens": int(tokens.size), "max_token_id": int(tokens.max()),
                 "next_document": self.next_document, "next_offset": self.next_offset}
        if self.pad_token is not None:
            shard["text_tokens"] = int(np.count_nonzero(tokens != self.pad_token))
        self.manifest["shards"].append(shard)
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
    differing = [key for key in SETTINGS_KEYS if manifest.get(key) != settings.get(key)]
    if differing:
        raise ValueError(f"{out} was prepared with different {', '.join(differing)} ({manifest.get('command')}): "
                         "rerun that command to finish it, add --overwrite to replace it, or choose another --out")
    if not manifest.get("complete"):
        manifest["shards"] = _finished_shards(out, manifest["shards"])
    return manifest


def _numbered_texts(source: dict, rule: SplitRule, start: int) -> Iterator[tuple[int, str]]:
    """(position in the output order, text) of the documents at ``start`` or later, in stream order."""
    index = -1
    for index, text in enumerate(load_documents(source)):
        position = rule.position(index)
        if position >= start:
            yield position, text
    if rule.documents is not None and index + 1 != rule.documents:
        raise ValueError(f"the source holds {index + 1:,} documents, not the {rule.documents:,} the {rule.name} "
                         "split was computed for, so its validation split cannot be the reference one")


def _write_documents(writer: ShardWriter, rule: SplitRule, source: dict, workers: int, progress: tqdm) -> int:
    """Tokenize the documents from the writer's position on into its shards; returns how many tokens it added."""
    start, start_offset = writer.next_document, writer.next_offset
    added = 0
    # Documents come in stream order and leave in output order: only the nanogpt val documents wait, until the
    # train documents before them in the output order are written.
    waiting, document = {}, start
    for position, tokens in tokenize_documents(_numbered_texts(source, rule, start), workers, rule.eot_first):
        waiting[position] = tokens
        while document in waiting:
            tokens = waiting.pop(document)
            offset = start_offset if document == start else 0
            rule.route(writer, document, tokens, offset)
            added += len(tokens) - offset
            progress.update(len(tokens) - offset)
            document += 1
    writer.finish()
    return added


def _overwriting_directory(out: Path, settings: dict) -> Path:
    """Where ``--overwrite`` prepares before replacing ``out``: an interrupted overwrite with the same settings is
    continued there, anything else there is cleared. Refuses an ``out`` this script did not make."""
    if read_manifest(out) is None:
        raise ValueError(f"--overwrite replaces only a directory that `python -m data.prepare` made, and {out} has "
                         "no manifest.json: choose another --out, or empty it yourself")
    staging = beside(out, OVERWRITING_SUFFIX)
    manifest = read_manifest(staging) if staging.is_dir() else None
    if staging.exists() and (manifest is None or any(manifest.get(key) != settings.get(key) for key in SETTINGS_KEYS)):
        shutil.rmtree(staging)
    return staging


def _replace_directory(out: Path, prepared: Path) -> None:
    """Put the finished ``prepared`` corpus in the place of ``out``, whose old corpus is then deleted."""
    replaced = beside(out, REPLACED_SUFFIX)
    if replaced.exists():
        shutil.rmtree(replaced)
    out.rename(replaced)
    prepared.rename(out)
    shutil.rmtree(replaced)
    log.info("replaced the corpus in %s with the new one", out)


def _finish_interrupted_replacement(out: Path, settings: dict) -> dict | None:
    """An ``--overwrite`` stopped inside ``_replace_directory`` left the old corpus in ``<out>.replaced``: finish
    what it was doing, so that ``out`` holds one whole corpus and nothing is left behind. Returns the manifest of
    ``out`` when it now holds that overwrite's complete corpus and it had these settings (nothing is left to do)."""
    replaced = beside(out, REPLACED_SUFFIX)
    if not replaced.is_dir():
        return None
    if not out.exists():  # stopped between the two renames: the new corpus is complete in the staging directory
        staging = beside(out, OVERWRITING_SUFFIX)
        manifest = read_manifest(staging) if staging.is_dir() else None
        if manifest is None or not manifest.get("complete"):
            replaced.rename(out)
            log.warning("an interrupted --overwrite left no complete new corpus: %s holds the old one again", out)
            return None
        staging.rename(out)
    shutil.rmtree(replaced)
    manifest = read_manifest(out)
    log.info("finished an interrupted --overwrite: %s holds its new corpus", out)
    if manifest and manifest.get("complete") and all(manifest.get(key) == settings.get(key) for key in SETTINGS_KEYS):
        return manifest
    return None


def prepare(source: dict, out: str | os.PathLike, *, split: str = FirstDocuments.name,
            shard_size: int = DEFAULT_SHARD_SIZE, val_tokens: int | None = None, test_size: float | None = None,
            documents: int | None = None, workers: int | None = None, command: str = "",
            overwrite: bool = False) -> dict:
    """Tokenize ``source`` into shards under ``out`` (resuming an interrupted run); returns the manifest.

    ``split`` names the rule (``nanogpt``, ``llm.c``, ``first-documents``); ``val_tokens`` parameterizes the last
    two, ``test_size`` the first. ``documents``, the number of documents of the source if known, saves the nanogpt
    rule a counting pass. ``overwrite`` replaces a corpus already in ``out`` once the new one is complete.
    """
    rule = split_rule(split, val_tokens=val_tokens, test_size=test_size)
    if shard_size <= 0:
        raise ValueError(f"--shard-size must be positive, got {shard_size}")
    if workers is None:
        workers = os.cpu_count() or 1
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    out = Path(out).expanduser()
    separator = "<|endoftext|> " + ("before" if rule.eot_first else "after") + " each document"
    settings = {"source": source, "tokenizer": "gpt2", "vocab_size": GPT2_VOCAB_SIZE, "eot_token": GPT2_EOT_TOKEN,
                "document_separator": separator, "split": rule.settings(), "shard_size": shard_size}
    return _prepare_alone(out, settings, overwrite, lambda directory: _prepare_into(
        directory, settings, rule, source, workers, documents, command, shown_as=out))


def _prepare_alone(out: Path, settings: dict, overwrite: bool, prepare_into) -> dict:
    """``prepare_into(directory)`` for ``out``, or for the directory beside it that replaces it (``overwrite``), by
    one process at a time: a second one waits, then resumes or finds it complete. Returns the manifest."""
    with sole_writer(out) as sole:
        manifest = _finish_interrupted_replacement(out, settings)
        if manifest is None and overwrite and out.is_dir() and any(out.iterdir()):
            staging = _overwriting_directory(out, settings)
            manifest = prepare_into(staging)
            _replace_directory(out, staging)
        elif manifest is None:
            manifest = prepare_into(out)
        if sole:  # what writers killed before their rename left
            remove_temporaries(out)
    return manifest


def prepare_c4(out: str | os.PathLike, *, local: Path | None = None, tokenizer: str = c4.TOKENIZER,
               train_documents: int = c4.TRAIN_DOCUMENTS, val_tokens: int = c4.VAL_TOKENS,
               shard_size: int = DEFAULT_SHARD_SIZE, command: str = "", overwrite: bool = False) -> dict:
    """C4 as GaLore reads it (``data/c4.py``) into rows under ``out``, from the Hub or a ``local`` copy of its
    files; resumed and overwritten as ``prepare``. Returns the manifest."""
    tokenizer = c4.tokenizer_reference(tokenizer)
    source, loaded = c4.C4Source(local), c4.load_tokenizer(tokenizer)
    settings = c4.c4_settings(source, tokenizer, loaded, train_documents, val_tokens, shard_size)
    out = Path(out).expanduser()

    def prepare_into(directory: Path) -> dict:
        manifest = _start_or_resume(directory, settings)
        if manifest["complete"]:
            log.info("%s is already prepared (%s)", out, manifest["tokens"])
            return manifest
        manifest["command"] = command or manifest.get("command", "")
        writer = ShardWriter(directory, manifest)
        with tqdm(desc=f"C4 rows into {out}", unit="doc", unit_scale=True, initial=writer.next_document) as progress:
            documents = c4.write_c4_rows(writer, source, loaded, settings, progress)
        manifest["text_tokens"] = {split: sum(s["text_tokens"] for s in manifest["shards"] if s["split"] == split)
                                   for split in SPLITS}
        _complete(directory, manifest, documents, out)
        log.info("%s: %s documents as rows of %d tokens, %s", out, f"{documents:,}", c4.ROW_TOKENS,
                 ", ".join(f"{split} {count:,} text tokens" for split, count in manifest["text_tokens"].items()))
        return manifest

    return _prepare_alone(out, settings, overwrite, prepare_into)


def _prepare_into(out: Path, settings: dict, rule: SplitRule, source: dict, workers: int, documents: int | None,
                  command: str, shown_as: Path) -> dict:
    """``prepare`` into the directory ``out``, which messages call ``shown_as`` (the --out that it becomes)."""
    manifest = _start_or_resume(out, settings)
    if manifest["complete"]:
        log.info("%s is already prepared (%s)", out, manifest["tokens"])
        return manifest
    manifest["command"] = command or manifest.get("command", "")
    if isinstance(rule, NanoGPTSplit):
        manifest["documents"] = manifest.get("documents") or documents or count_documents(source)
        rule = replace(rule, documents=manifest["documents"])
    writer = ShardWriter(out, manifest)
    if manifest["shards"]:
        log.info("resuming %s after %d finished shards, at document %d", out, len(manifest["shards"]),
                 writer.next_document)
    done_tokens = sum(s["tokens"] for s in manifest["shards"])
    started = time.perf_counter()
    with tqdm(desc=f"tokenizing into {out}", unit="tok", unit_scale=True, initial=done_tokens) as progress:
        new_tokens = _write_documents(writer, rule, source, workers, progress)
    seconds = time.perf_counter() - started
    _complete(out, manifest, writer.next_document, shown_as)
    log.info("%s: %s tokens in %d shards; tokenized %d tokens in %.1f s (%.0f tokens/s, %.0f per worker)",
             shown_as, manifest["tokens"], len(manifest["shards"]), new_tokens, seconds, new_tokens / seconds,
             new_tokens / seconds / workers)
    return manifest


def _complete(out: Path, manifest: dict, documents: int, shown_as: Path) -> None:
    tokens = {split: sum(s["tokens"] for s in manifest["shards"] if s["split"] == split) for split in SPLITS}
    if not tokens["train"]:
        # Whole documents cannot make a split of a corpus that is one long document (a single .txt file): a
        # split that cuts inside a document can, so the advice names one that works.
        val_tokens, why = advised_val_tokens(tokens["val"])
        raise ValueError(f"the corpus has only {tokens['val']:,} tokens in {documents:,} document(s), all held out "
                         f"for validation ({manifest['split']['description']}): rerun with `--split llm.c "
                         f"--val-tokens {val_tokens} --overwrite`, which holds out the first {val_tokens:,} tokens "
                         f"({why}), cuts the document there and replaces what this run left in {shown_as}")
    manifest.update(complete=True, documents=documents, tokens=tokens,
                    max_token_id=max(s["max_token_id"] for s in manifest["shards"]))
    write_manifest(out, manifest)
    short = [f"{split} {count:,}" for split, count in tokens.items() if count < DEFAULT_BATCH_TOKENS]
    if short:
        log.warning("%s: split(s) shorter than one batch of the trainer's defaults (%s = %s tokens): %s tokens. "
                    "Train with a smaller train.batch_size or train.block_size, or prepare more text", shown_as,
                    DEFAULT_BATCH, f"{DEFAULT_BATCH_TOKENS:,}", ", ".join(short))


def advised_val_tokens(total: int) -> tuple[int, str]:
    """The --val-tokens that cut a corpus of ``total`` tokens into a val and a train split that both hold one batch
    of the trainer's defaults, or into halves where it is too small for that; and why, in words."""
    val_tokens = max(total // 10, DEFAULT_BATCH_TOKENS)
    if total - val_tokens >= DEFAULT_BATCH_TOKENS:
        return val_tokens, f"a tenth, and at least one batch of the trainer's defaults: {DEFAULT_BATCH}"
    half = total // 2
    return half, (f"a half: each split is shorter than one batch of the trainer's defaults ({DEFAULT_BATCH} = "
                  f"{DEFAULT_BATCH_TOKENS:,}), so train with train.batch_size x train.block_size + 1 <= {half:,}")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, help="output directory (default for hub corpora: under "
                                                 "$MARS_DATA_CACHE or ~/.cache/mars-gpt2, where data=<name> looks)")
    common.add_argument("--split", choices=SPLIT_RULES, default=None,
                        help="validation split rule (default: nanogpt for openwebtext, llm.c for fineweb-edu, "
                             "first-documents for files)")
    common.add_argument("--val-tokens", type=int, default=None,
                        help="llm.c and first-documents: tokens held out from the start as the validation split "
                             f"(default {LlmcSplit.val_tokens:,} and {FirstDocuments.val_tokens:,})")
    common.add_argument("--test-size", type=float, default=None,
                        help=f"nanogpt: fraction of the documents held out (default {NanoGPTSplit.test_size})")
    common.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, help="tokens per shard")
    common.add_argument("--workers", type=int, default=None, help="tokenizer processes (default: all cores)")
    common.add_argument("--overwrite", action="store_true",
                        help="replace the corpus already in --out (prepared beside it, swapped in when complete)")
    parser = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    sources = parser.add_subparsers(dest="source", required=True)
    sources.add_parser("openwebtext", parents=[common], help="Skylion007/openwebtext (~9B tokens)")
    fineweb = sources.add_parser("fineweb-edu", parents=[common], help="HuggingFaceFW/fineweb-edu, one sample")
    fineweb.add_argument("--sample", choices=FINEWEB_EDU_SAMPLES, default=HUB_CORPORA["fineweb-edu"].config)
    files = sources.add_parser("files", parents=[common], help="local .txt, .jsonl/.json or .parquet files")
    files.add_argument("paths", nargs="+", type=Path)
    files.add_argument("--text-column", default="text", help="the column holding the text (.jsonl/.parquet)")
    c4_parser = sources.add_parser("c4", parents=[common], help="allenai/c4 en as GaLore reads it: t5-base rows of "
                                                                "256 tokens (data/c4.py)")
    c4_parser.add_argument("--from", dest="local", type=Path, default=None,
                           help="a local copy of allenai/c4 (the directory holding en/c4-*.json.gz) instead of the Hub")
    c4_parser.add_argument("--tokenizer", default=c4.TOKENIZER,
                           help="a Hub tokenizer id or a saved tokenizer's directory (default t5-base, GaLore's)")
    c4_parser.add_argument("--train-documents", type=int, default=c4.TRAIN_DOCUMENTS,
                           help=f"train documents (rows) to take (default {c4.TRAIN_DOCUMENTS:,}: the 1B preset's)")
    return parser


def rerun_command(argv: list[str]) -> str:
    """This preparation's command, kept in its manifest for an interrupted one to be rerun as printed: from the
    directory it was started in (its --out and files may be relative) and by this interpreter's path (a shell
    without the venv activated runs it)."""
    return f"cd {shlex.quote(os.getcwd())} && {shlex.join([sys.executable, '-m', 'data.prepare', *argv])}"


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    out = args.out
    try:
        if args.source == "files":
            if args.out is None:
                raise ValueError("files needs --out DIR: the directory to write the shards to")
            source, out = files_source(args.paths, args.text_column), args.out
            split, documents = args.split or FirstDocuments.name, None
        elif args.source == "c4":
            not_for_c4 = [flag for flag, value in (("--split", args.split), ("--test-size", args.test_size),
                                                   ("--workers", args.workers)) if value is not None]
            if not_for_c4:
                raise ValueError(f"{' and '.join(not_for_c4)} {'does' if len(not_for_c4) == 1 else 'do'} not apply to "
                                 "c4, whose split is GaLore's and whose tokenizer runs on its own threads (data/c4.py)")
            out = args.out or default_directory(HUB_CORPORA["c4"])
            prepare_c4(out, local=args.local, tokenizer=args.tokenizer, train_documents=args.train_documents,
                       val_tokens=c4.VAL_TOKENS if args.val_tokens is None else args.val_tokens,
                       shard_size=args.shard_size, command=rerun_command(argv), overwrite=args.overwrite)
            return
        else:
            corpus = HUB_CORPORA[args.source]
            if args.source == "fineweb-edu":
                corpus = replace(corpus, config=args.sample)
            source, out = hub_source(corpus), args.out or default_directory(corpus)
            split, documents = args.split or corpus.split, corpus.documents
        prepare(source, out, split=split, shard_size=args.shard_size, val_tokens=args.val_tokens,
                test_size=args.test_size, documents=documents, workers=args.workers,
                command=rerun_command(argv), overwrite=args.overwrite)
    except (ValueError, FileNotFoundError, ConnectionError) as err:
        raise SystemExit(f"error: {err}") from None
    except OSError as err:  # an unreadable input, a read-only or full --out (the finished shards are kept)
        raise SystemExit(f"error: {unusable_path(err, out, default_out=args.out is None)}") from None


def unusable_path(err: OSError, out: Path, default_out: bool) -> str:
    """What to do about a file that ``data.prepare`` could not read or write."""
    if err.errno == errno.ENAMETOOLONG:
        name = max((Path(name).name for name in (err.filename, err.filename2) if name),
                   key=lambda name: len(os.fsencode(name)), default=out.name)
        return (f"a name of {len(os.fsencode(name))} bytes ({name[:40]}...) is longer than the file system takes "
                f"({longest_name(out.parent)} bytes): choose a shorter --out")
    if default_out and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
        return f"{unwritable_cache(out, err)}"
    return (f"could not read or write {err.filename or out} ({err.strerror or err}): fix its permissions or free "
            "space, then rerun the command (it continues after the last finished shard)")


if __name__ == "__main__":
    main()
