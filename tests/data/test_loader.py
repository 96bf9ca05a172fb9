import numpy as np
import pytest
import torch

from data.loader import TokenBatches, load_split, resolve_data_dir
from data.shards import write_shard


def _batches(tokens, **kwargs):
    args = dict(batch_size=4, block_size=16, seed=3)
    args.update(kwargs)
    return TokenBatches(tokens, "train", **args)


def test_batches_are_a_pure_function_of_seed_step_and_micro_step():
    tokens = np.arange(10_000) % 50257
    first, again = _batches(tokens), _batches(tokens)
    x1, y1 = first.batch(7, 1)
    x2, y2 = again.batch(7, 1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(first.batch(8, 1)[0], x1)
    assert not torch.equal(first.batch(7, 0)[0], x1)
    assert not torch.equal(_batches(tokens, seed=4).batch(7, 1)[0], x1)


def test_targets_are_inputs_shifted_by_one_token():
    tokens = np.arange(10_000)
    x, y = _batches(tokens).batch(0)
    assert x.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(y, x + 1)


def test_ranks_draw_different_windows():
    tokens = np.arange(100_000)
    assert not torch.equal(_batches(tokens, rank=0).batch(0)[0], _batches(tokens, rank=1).batch(0)[0])


def test_split_shorter_than_one_window_is_rejected():
    with pytest.raises(ValueError, match="fewer than one window"):
        _batches(np.arange(16))


def test_token_ids_beyond_the_vocabulary_are_rejected(tmp_path):
    write_shard(tmp_path / "train.bin", np.array([1, 2, 60000]))
    with pytest.raises(ValueError, match="60000"):
        load_split(tmp_path, "train", vocab_size=50304)


def test_missing_data_directory_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="prepare"):
        resolve_data_dir("custom", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="data.dir"):
        resolve_data_dir("openwebtext", None)
