"""Token shards on disk, in llm.c's layout so that shards made by llm.c (or by us) are interchangeable.

A shard is a 1024-byte header of 256 little-endian int32 -- [magic 20240520, version 1, token count, 0...] --
followed by the tokens as little-endian uint16 (GPT-2's 50,257 ids fit). Shards are written to a temporary
name of their writer's own and renamed, so a shard that exists is complete, two writers never write into one file,
and a file once written is never rewritten in place: a run that keeps a shard open reads the tokens it opened,
whatever is renamed over its path later (``ShardFiles``).

A directory of shards made by ``data.prepare`` also holds ``manifest.json``: where the tokens came from, the
tokenizer and its vocabulary size, the largest token id, and every shard with its token count. A corpus of rows
(C4, ``data/c4.py``) says so in its manifest's ``rows``: each document is one row of ``tokens`` tokens, padded with
``pad_token``, and every shard holds whole rows.
"""
import contextlib
import errno
import getpass
import json
import mmap
import os
import resource
import socket
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MANIFEST_FILE = "manifest.json"
TEMPORARY_SUFFIX = ".tmp"


@dataclass(frozen=True)
class RowLayout:
    """A corpus whose every document is its own row of ``tokens`` tokens, padded at its end with ``pad_token``."""

    tokens: int
    pad_token: int

    @classmethod
    def of(cls, manifest: dict | None) -> "RowLayout | None":
        rows = (manifest or {}).get("rows")
        return cls(rows["tokens"], rows["pad_token"]) if rows else None

    def as_manifest(self) -> dict:
        return {"tokens": self.tokens, "pad_token": self.pad_token}


GPT2_TOKENIZER = "gpt2"  # the manifest's name of GPT-2's tokenizer (data.prepare's text corpora, the embedded one)


def corpus_tokenizer(manifest: dict | None) -> dict | None:
    """Whose token ids a corpus holds, as its manifest says: the tokenizer's name and the fingerprint of its
    vocabulary (C4's; None for GPT-2's, which ships with data/). None without a manifest: GPT-2's is assumed."""
    if manifest is None:
        return None
    return {"name": manifest["tokenizer"], "fingerprint": manifest.get("tokenizer_fingerprint")}


def reads_gpt2_tokens(tokenizer: dict | None) -> bool:
    """Whether a corpus (or a model trained on it) of this ``corpus_tokenizer`` record is in GPT-2's tokens."""
    return tokenizer is None or tokenizer["name"] == GPT2_TOKENIZER


class ShardError(ValueError):
    """A shard file that is not a valid token shard; the message names the file and what is wrong."""


def write_shard(path: str | os.PathLike, tokens: np.ndarray) -> None:
    """Write ``tokens`` (ints in [0, 65535]) to ``path`` atomically."""
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(TOKEN_DTYPE).max):
        raise ValueError(f"tokens must lie in [0, 65535] to be stored as uint16 in {path}")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (SHARD_MAGIC, SHARD_VERSION, tokens.size)
    write_atomically(path, header.tobytes(), tokens.astype(TOKEN_DTYPE, copy=False).tobytes())


def write_atomically(path: Path, *contents: bytes) -> None:
    """Write ``contents`` to a temporary file of this process's own beside ``path``, then rename it to ``path``: a
    reader sees the old file or the new one, whole, and two processes writing one path at once (two launches
    preparing an empty cache where the file system has no locks) each rename a file of their own."""
    tmp = path.with_name(f"{path.name}.{socket.gethostname()}-{os.getpid()}{TEMPORARY_SUFFIX}")
    try:
        with open(tmp, "wb") as f:
            for content in contents:
                f.write(content)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a kill: no partial file is left to fill the disk further
        tmp.unlink(missing_ok=True)
        raise


def remove_temporaries(directory: Path) -> None:
    """Delete the temporary files that writers killed before their rename left in ``directory``; only for the
    directory's one writer (``data.writer_lock``), which is then the only process writing there."""
    for leftover in directory.glob(f"*{TEMPORARY_SUFFIX}"):
        leftover.unlink(missing_ok=True)


def read_shard(path: str | os.PathLike) -> np.ndarray:
    """Memory-map the tokens of a shard, after checking its header against its size."""
    path = Path(path)
    with opened_shard(path) as (descriptor, num_tokens, _):
        return map_tokens(path, descriptor, num_tokens)


@contextlib.contextmanager
def opened_shard(path: Path):
    """``open_shard(path)``, its descriptor closed on leaving."""
    descriptor, num_tokens, status = open_shard(path)
    try:
        yield descriptor, num_tokens, status
    finally:
        os.close(descriptor)


def open_shard(path: Path) -> tuple[int, int, os.stat_result]:
    """An open descriptor of the shard at ``path``, its token count (the header checked against the file's size)
    and its ``os.stat_result``."""
    with unreadable_as_shard_error(path):
        if path.is_dir():
            raise ShardError(f"token shard {path} is a directory, not a shard file: move it out of the way, or "
                             "prepare the corpus again")
        if not path.is_file():
            raise ShardError(f"token shard {path} does not exist")
        descriptor = os.open(path, os.O_RDONLY)
    try:
        with unreadable_as_shard_error(path):
            status = os.fstat(descriptor)
            header = os.pread(descriptor, HEADER_BYTES, 0)
        return descriptor, checked_token_count(path, header, status.st_size), status
    except BaseException:
        os.close(descriptor)
        raise


def checked_token_count(path: Path, header: bytes, size: int) -> int:
    """The token count that the header of the ``size``-byte shard at ``path`` declares, checked against its size."""
    if size < HEADER_BYTES:
        raise ShardError(f"{path} is {size} bytes, shorter than the {HEADER_BYTES}-byte shard header")
    magic, version, num_tokens = (int(x) for x in np.frombuffer(header, dtype="<i4", count=3))
    if magic != SHARD_MAGIC:
        raise ShardError(f"{path} has magic {magic}, expected {SHARD_MAGIC}: not a token shard")
    if version != SHARD_VERSION:
        raise ShardError(f"{path} has shard version {version}; this reader supports version {SHARD_VERSION}")
    expected = HEADER_BYTES + num_tokens * TOKEN_DTYPE.itemsize
    if size != expected:
        raise ShardError(
            f"{path} declares {num_tokens} tokens ({expected} bytes) but is {size} bytes: "
            "truncated or corrupt, prepare it again"
        )
    if num_tokens == 0:
        raise ShardError(f"{path} holds no tokens")
    return num_tokens


def map_tokens(path: Path, descriptor: int, num_tokens: int) -> np.ndarray:
    """The tokens of the open shard ``descriptor``, memory-mapped (the map holds a descriptor of its own)."""
    with unreadable_as_shard_error(path):
        mapped = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mapped, dtype=TOKEN_DTYPE, count=num_tokens, offset=HEADER_BYTES)


class ShardFiles(Sequence):
    """The shards of a split, each opened when the split is loaded and kept open to the end: a run reads the files
    it started with to its end, whatever is renamed over their paths meanwhile (a corpus prepared again with
    ``data.prepare --overwrite``, which writes new files and renames them; the old ones live on, unnamed, until the
    run closes them).

    An open shard holds a file descriptor, and so does each memory map of one: a split uses at most
    ``open_files`` of them (default a quarter of the process's limit, ``ulimit -n``), of which a quarter, and at
    most 64, go to maps of the shards last read (the least recently read map is closed first). A split of more
    shards than the rest keeps its first shards open and opens the others when read, by their path: one that is no
    longer the file it was at the start stops the run (:class:`ShardChanged`) rather than feed it other tokens."""

    def __init__(self, paths: list[Path], open_files: int | None = None) -> None:
        self.paths = list(paths)
        open_files = open_files or open_files_per_split()
        self.max_open = max(1, min(64, open_files // 4))
        held_at_most = max(1, open_files - self.max_open)
        self.lengths, self.identities, held = [], [], []
        self._finalizer = weakref.finalize(self, _close_all, held)
        for path in self.paths:
            descriptor, num_tokens, status = open_shard(path)
            self.lengths.append(num_tokens)
            self.identities.append(_identity(status))
            if len(held) < held_at_most:
                held.append(descriptor)
            else:
                os.close(descriptor)
        self._held = held
        self._open: OrderedDict[int, np.ndarray] = OrderedDict()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> np.ndarray:
        index = range(len(self.paths))[index]  # negative indices count from the end; past it: IndexError
        if index in self._open:
            self._open.move_to_end(index)
            return self._open[index]
        if len(self._open) >= self.max_open:
            self._open.popitem(last=False)
        shard = self._open[index] = self._map(index)
        return shard

    def _map(self, index: int) -> np.ndarray:
        path = self.paths[index]
        if index < len(self._held):
            return map_tokens(path, self._held[index], self.lengths[index])
        with opened_shard(path) as (descriptor, num_tokens, status):
            if _identity(status) != self.identities[index]:
                raise ShardChanged(
                    f"{path} is no longer the file this run opened at its start (its corpus was prepared again or "
                    "replaced): the run stops rather than train on other tokens than its records name. Put that "
                    "corpus back and resume the run, or start a new run on the new one; a run keeps every shard "
                    f"open, undisturbed by such a change, where a quarter of its open-file limit holds them: "
                    f"`ulimit -n {4 * (len(self.paths) + 64)}` in the job script")
            return map_tokens(path, descriptor, num_tokens)


class ShardChanged(ShardError):
    """A shard that a running split reopened by its path is another file than the one it opened at its start."""


def _identity(status: os.stat_result) -> tuple[int, ...]:
    """What tells a file from another put at its path since (a rename writes a new inode; its time tells a reused
    inode number apart)."""
    return status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns


def _close_all(descriptors: list[int]) -> None:
    for descriptor in descriptors:
        os.close(descriptor)


def open_files_per_split() -> int:
    """How many file descriptors a split may use: a quarter of the open-file limit, leaving room for the other split
    and everything else the process opens."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(2, soft_limit // 4) if soft_limit != resource.RLIM_INFINITY else 65536


@contextlib.contextmanager
def unreadable_as_shard_error(path: Path):
    """Turn an ``OSError`` met reading ``path`` (permissions, a vanished mount, I/O) into a :class:`ShardError`
    that names the file the system refused and the fix."""
    try:
        yield
    except OSError as err:
        refused = err.filename or path
        if err.errno == errno.EMFILE:
            raise ShardError(f"cannot open {refused}: {too_many_open_files()}") from None
        raise ShardError(f"cannot read {refused} ({err.strerror or err}): make it readable to this user "
                         f"({getpass.getuser()}), or point data.dir at a copy that is") from None


def too_many_open_files() -> str:
    """What to do once this process has as many files open as its limit allows."""
    soft_limit, hard_limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard_limit != resource.RLIM_INFINITY and hard_limit <= soft_limit:
        return (f"this process has as many files open as its limit allows (ulimit -n: {soft_limit}, also the hard "
                "limit): ask the administrator to raise it")
    raised = 65536 if hard_limit == resource.RLIM_INFINITY else min(hard_limit, 65536)
    return (f"this process has as many files open as its limit allows (ulimit -n: {soft_limit}): raise it, e.g. "
            f"`ulimit -n {raised}` in the shell or job script that starts the run")


def write_manifest(directory: str | os.PathLike, manifest: dict) -> None:
    """Write ``manifest.json`` into ``directory`` atomically."""
    write_atomically(Path(directory) / MANIFEST_FILE, (json.dumps(manifest, indent=1) + "\n").encode())


def read_manifest(directory: str | os.PathLike) -> dict | None:
    """The manifest of a shard directory, or None if it has none (shards made by llm.c or by hand)."""
    path = Path(directory) / MANIFEST_FILE
    with unreadable_as_shard_error(path):
        exists, is_dir = path.exists(), path.is_dir()
    if not exists:
        return None
    if is_dir:
        raise ShardError(f"{path} is a directory, not a manifest: move it out of the way, or prepare the corpus again")
    with unreadable_as_shard_error(path):
        text = path.read_bytes()
    try:
        manifest = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ShardError(f"{path} is not valid JSON ({err}): prepare the corpus again") from None
    if not isinstance(manifest, dict):
        raise ShardError(f"{path} does not hold a JSON object: prepare the corpus again")
    check_manifest_types(manifest, path)
    return manifest


def check_manifest_types(manifest: dict, path: Path) -> None:
    """Each field that a manifest has is of the type ``data.prepare`` writes (a hand-edited or foreign manifest
    would otherwise fail deep in the loader); which fields must be there is the reader's business."""
    def refuse(field: str, value, expected: str) -> None:
        raise ShardError(f"{path}: {field} is {value!r}, not {expected}: it was not written by `python -m "
                         "data.prepare`, or was edited since; prepare the corpus again")

    for key, expected in _MANIFEST_FIELD_TYPES.items():
        if key in manifest and not _is_a(manifest[key], expected):
            refuse(key, manifest[key], _TYPE_NAMES[expected])
    rows = manifest.get("rows")
    if rows is not None and not (isinstance(rows, dict) and all(_is_a(rows.get(key), int) and rows[key] >= 0
                                                                 for key in ("tokens", "pad_token"))
                                 and rows["tokens"] > 1):
        refuse("rows", rows, 'an object {"tokens": rows of at least 2, "pad_token": an id}')
    shards = manifest.get("shards", [])
    if not isinstance(shards, list):
        refuse("shards", shards, "a list")
    for k, shard in enumerate(shards):
        if not isinstance(shard, dict):
            refuse(f"shards[{k}]", shard, "an object")
        for key, expected in _SHARD_FIELD_TYPES.items():
            if key not in shard:
                raise ShardError(f"{path}: shards[{k}] has no {key!r}: it was not written by `python -m data.prepare`, "
                                 "or was edited since; prepare the corpus again")
            if not _is_a(shard[key], expected):
                refuse(f"shards[{k}].{key}", shard[key], _TYPE_NAMES[expected])


_MANIFEST_FIELD_TYPES = {"tokenizer": str, "vocab_size": int, "max_token_id": int, "complete": bool}
_SHARD_FIELD_TYPES = {"file": str, "split": str, "tokens": int, "max_token_id": int}
_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false"}


def _is_a(value, expected: type) -> bool:
    # JSON's true is a Python bool, which is also an int: never a count.
    return isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
