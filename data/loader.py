"""Batches of token windows, each a pure function of (seed, split, step, micro-step, rank).

Nothing is carried from one batch to the next, so a resumed run sees exactly the batches the uninterrupted
run would have seen, and the exact MARS scheme can ask for the next step's batch ahead of time.
"""
from pathlib import Path

import numpy as np
import torch

from data.embedded import prepare_embedded
from data.shards import read_shard

SPLITS = ("train", "val")
_SPLIT_IDS = {"train": 0, "val": 1}


def resolve_data_dir(name: str, directory: str | None) -> Path:
    """The directory holding ``train.bin``/``val.bin`` for a data config."""
    if directory is None:
        if name != "embedded":
            raise ValueError(f"data.dir is required for data={name}: point it at a directory of token shards")
        return prepare_embedded()
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {path} does not exist: create it with the corpus' prepare command "
            "(see README, 'Data'), or set data.dir to an existing shard directory"
        )
    return path


def load_split(data_dir: Path, split: str, vocab_size: int) -> np.ndarray:
    """Memory-map one split's tokens and check that every token id fits the model's vocabulary."""
    tokens = read_shard(data_dir / f"{split}.bin")
    largest = int(tokens.max())
    if largest >= vocab_size:
        raise ValueError(
            f"{data_dir / f'{split}.bin'} holds token id {largest} >= model.vocab_size {vocab_size}: "
            "the shards were made with a different tokenizer than the model expects"
        )
    return tokens


class TokenBatches:
    """Random (input, target) windows of ``block_size`` tokens from one split, nanoGPT-style."""

    def __init__(self, tokens: np.ndarray, split: str, *, batch_size: int, block_size: int, seed: int,
                 rank: int = 0, device: torch.device = torch.device("cpu"), source: str = "") -> None:
        if len(tokens) < block_size + 1:
            raise ValueError(
                f"the {split} split {source} has {len(tokens)} tokens, fewer than one window of "
                f"train.block_size + 1 = {block_size + 1}: use more data or a smaller train.block_size"
            )
        self.tokens, self.split = tokens, split
        self.batch_size, self.block_size = batch_size, block_size
        self.seed, self.rank, self.device = seed, rank, device

    def batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, _SPLIT_IDS[self.split], step, micro_step, self.rank])
        starts = rng.integers(0, len(self.tokens) - self.block_size, size=self.batch_size)
        windows = np.stack([self.tokens[s : s + self.block_size + 1] for s in starts]).astype(np.int64)
        x = torch.from_numpy(np.ascontiguousarray(windows[:, :-1]))
        y = torch.from_numpy(np.ascontiguousarray(windows[:, 1:]))
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)
