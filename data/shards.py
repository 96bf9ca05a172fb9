"""Token shards on disk, in llm.c's layout so that shards made by llm.c (or by us) are interchangeable.

A shard is a 1024-byte header of 256 little-endian int32 -- [magic 20240520, version 1, token count, 0...] --
followed by the tokens as little-endian uint16 (GPT-2's 50,257 ids fit). Shards are written to a temporary
name and renamed, so a shard that exists is complete.

A directory of shards made by ``data.prepare`` also holds ``manifest.json``: where the tokens came from, the
tokenizer and its vocabulary size, the largest token id, and every shard with its token count.
"""
import contextlib
import errno
import getpass
import json
import os
import resource
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_DTYPE = np.dtype("<u2")
MANIFEST_FILE = "manifest.json"


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
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a kill: no partial file is left to fill the disk further
        tmp.unlink(missing_ok=True)
        raise


def read_shard(path: str | os.PathLike) -> np.memmap:
    """Memory-map the tokens of a shard, after checking its header against its size."""
    path = Path(path)
    num_tokens = shard_length(path)
    with unreadable_as_shard_error(path):
        return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(num_tokens,))


def shard_length(path: Path) -> int:
    """The number of tokens of a shard, after checking its header against its size (the file is not kept open)."""
    with unreadable_as_shard_error(path):
        if path.is_dir():
            raise ShardError(f"token shard {path} is a directory, not a shard file: move it out of the way, or "
                             "prepare the corpus again")
        if not path.is_file():
            raise ShardError(f"token shard {path} does not exist")
        size = path.stat().st_size
        if size < HEADER_BYTES:
            raise ShardError(f"{path} is {size} bytes, shorter than the {HEADER_BYTES}-byte shard header")
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    magic, version, num_tokens = (int(x) for x in header[:3])
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


class ShardFiles(Sequence):
    """The shards of a split, memory-mapped when read, at most ``max_open`` at a time (the least recently read
    is closed first): each map holds a file descriptor, and a corpus of many shards would exceed the process's
    limit of open files (``ulimit -n``)."""

    def __init__(self, paths: list[Path], lengths: list[int], max_open: int | None = None) -> None:
        self.paths, self.lengths = list(paths), list(lengths)
        self.max_open = max_open or max_open_shards()
        self._open: OrderedDict[int, np.memmap] = OrderedDict()

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> np.memmap:
        index = range(len(self.paths))[index]  # negative indices count from the end; past it: IndexError
        if index in self._open:
            self._open.move_to_end(index)
            return self._open[index]
        if len(self._open) >= self.max_open:
            self._open.popitem(last=False)
        shard = self._open[index] = read_shard(self.paths[index])
        return shard


def max_open_shards() -> int:
    """How many shards a split keeps mapped: a quarter of the open-file limit, leaving room for the other split
    and everything else the process opens, and at most 64."""
    soft_limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(1, min(64, soft_limit // 4)) if soft_limit != resource.RLIM_INFINITY else 64


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
    path = Path(directory) / MANIFEST_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, path)


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
