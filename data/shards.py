"""Token shards on disk, in llm.c's layout so that shards made by llm.c (or by us) are interchangeable.

A shard is a 1024-byte header of 256 little-endian int32 -- [magic 20240520, version 1, token count, 0...] --
followed by the tokens as little-endian uint16 (GPT-2's 50,257 ids fit). Shards are written to a temporary
name and renamed, so a shard that exists is complete.

A directory of shards made by ``data.prepare`` also holds ``manifest.json``: where the tokens came from, the
tokenizer and its vocabulary size, the largest token id, and every shard with its token count.
"""
import json
import os
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
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(TOKEN_DTYPE, copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_shard(path: str | os.PathLike) -> np.memmap:
    """Memory-map the tokens of a shard, after checking its header against its size."""
    path = Path(path)
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
    return np.memmap(path, dtype=TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(num_tokens,))


def write_manifest(directory: str | os.PathLike, manifest: dict) -> None:
    """Write ``manifest.json`` into ``directory`` atomically."""
    path = Path(directory) / MANIFEST_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    os.replace(tmp, path)


def read_manifest(directory: str | os.PathLike) -> dict | None:
    """The manifest of a shard directory, or None if it has none (shards made by llm.c or by hand)."""
    path = Path(directory) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ShardError(f"{path} is not valid JSON ({err}): prepare the corpus again") from None
    if not isinstance(manifest, dict):
        raise ShardError(f"{path} does not hold a JSON object: prepare the corpus again")
    return manifest
