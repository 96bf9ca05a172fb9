import json
import logging
import re
import shlex
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from configs.schema import Sampling
from data.loader import ShardedTokens, TokenBatches, build_batches, load_split, resolve_data_dir
from data.shards import ShardError, read_manifest, write_manifest, write_shard
from data.tokenizer import gpt2_encoding

MODES = list(Sampling)


def _batches(tokens, **kwargs):
    args = dict(batch_size=4, block_size=16, seed=3)
    args.update(kwargs)
    return TokenBatches(tokens, "train", **args)


def _starts(batches, step, micro_step=0):
    return batches.window_starts(step, micro_step).tolist()


@pytest.mark.parametrize("sampling", MODES)
def test_batches_are_a_pure_function_of_seed_step_and_micro_step(sampling):
    tokens = np.arange(10_000) % 50257
    first, again = _batches(tokens, sampling=sampling), _batches(tokens, sampling=sampling)
    x1, y1 = first.batch(7, 1)
    x2, y2 = again.batch(7, 1)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(first.batch(8, 1)[0], x1)
    assert not torch.equal(first.batch(7, 0)[0], x1)


def test_random_windows_depend_on_the_seed():
    tokens = np.arange(10_000)
    assert not torch.equal(_batches(tokens, seed=4).batch(7, 1)[0], _batches(tokens, seed=3).batch(7, 1)[0])


@pytest.mark.parametrize("sampling", MODES)
def test_batch_at_step_k_is_the_same_whether_or_not_earlier_steps_were_drawn(sampling):
    tokens = np.arange(50_000)
    resumed = _batches(tokens, sampling=sampling, grad_accum_steps=2).batch(40, 1)
    uninterrupted = _batches(tokens, sampling=sampling, grad_accum_steps=2)
    for step in range(40):
        for micro_step in range(2):
            uninterrupted.batch(step, micro_step)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted.batch(40, 1), resumed))


@pytest.mark.parametrize("sampling", MODES)
def test_the_next_steps_batch_drawn_ahead_is_the_batch_that_step_then_draws(sampling):
    # Exact MARS takes its look-ahead gradient on step + 1's batch before step runs.
    ahead, in_order = (_batches(np.arange(50_000), sampling=sampling, grad_accum_steps=3) for _ in range(2))
    for step, micro_step in [(0, 0), (5, 2), (123, 1)]:
        early = ahead.batch(step + 1, micro_step)
        ahead.batch(step, micro_step)
        in_order.batch(step, micro_step)
        assert all(torch.equal(a, b) for a, b in zip(early, in_order.batch(step + 1, micro_step)))
        assert all(torch.equal(a, b) for a, b in zip(early, ahead.batch(step + 1, micro_step)))


@pytest.mark.parametrize("sampling", MODES)
def test_targets_are_inputs_shifted_by_one_token(sampling):
    x, y = _batches(np.arange(10_000), sampling=sampling).batch(3)
    assert x.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(y, x + 1)


def test_sequential_windows_are_contiguous_in_order_and_wrap_around_counting_epochs():
    block, windows = 16, 10
    batches = _batches(np.arange(windows * block + 1), sampling="sequential", batch_size=4, block_size=block)
    assert batches.windows_per_epoch == windows
    assert _starts(batches, 0) == [0, 16, 32, 48] and _starts(batches, 1) == [64, 80, 96, 112]
    assert _starts(batches, 2) == [128, 144, 0, 16]  # the split runs out: the next epoch begins
    # The first window of steps 0-5 is window 0, 4, 8, 12, 16, 20 of the stream: 0, 4, 8, 2, 6, 0 of its epoch
    assert [_starts(batches, step)[0] for step in range(6)] == [0, 64, 128, 32, 96, 0]
    x, _ = batches.batch(0)
    assert torch.equal(x.flatten(), torch.arange(64))


def test_sequential_ranks_never_share_a_window_and_together_cover_an_epoch_once():
    world_size, grad_accum_steps, batch_size, block, steps = 2, 2, 4, 16, 50
    tokens = np.arange(world_size * grad_accum_steps * batch_size * steps * block + 1)
    seen = []
    for rank in range(world_size):
        batches = _batches(tokens, sampling="sequential", rank=rank, world_size=world_size,
                           grad_accum_steps=grad_accum_steps, batch_size=batch_size, block_size=block)
        seen.append([s for step in range(steps) for micro in range(grad_accum_steps)
                     for s in _starts(batches, step, micro)])
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(0, len(tokens) - 1, block))


def test_random_ranks_draw_different_windows():
    tokens = np.arange(100_000)
    assert not torch.equal(_batches(tokens, rank=0, world_size=2).batch(0)[0],
                           _batches(tokens, rank=1, world_size=2).batch(0)[0])


def _shard_of(tokens, start):
    return int(np.searchsorted(tokens.ends, start, side="right"))


def test_random_shard_draws_a_micro_batch_from_inside_one_shard_each_shard_alike_whatever_its_length():
    block = 16
    tokens = ShardedTokens([np.arange(0, 1000), np.arange(1000, 1050), np.arange(1050, 6050)])
    batches = _batches(tokens, sampling="random_shard", block_size=block, grad_accum_steps=2)
    picks, short_shard_offsets = [0, 0, 0], set()
    for step in range(1500):
        for micro_step in range(2):
            starts = _starts(batches, step, micro_step)
            shard = _shard_of(tokens, starts[0])
            assert {_shard_of(tokens, s) for s in starts} == {shard}
            # The whole window, target token included, lies inside the shard.
            assert all(s + block + 1 <= tokens.ends[shard] for s in starts)
            picks[shard] += 1
            if shard == 1:
                short_shard_offsets.update(s - 1000 for s in starts)
    assert all(abs(count / 3000 - 1 / 3) < 0.05 for count in picks), picks  # uniform over shards, not tokens
    assert short_shard_offsets == set(range(50 - block))  # every start that keeps the window inside, no other
    x, y = batches.batch(7, 1)
    assert torch.equal(y, x + 1)


def test_random_shard_refuses_a_shard_shorter_than_a_window_naming_it(tmp_path):
    _write_split(tmp_path, "train", [np.arange(500), np.arange(10)])
    tokens = load_split(tmp_path, "train", vocab_size=50304)
    with pytest.raises(ValueError, match=r"train_000001.bin of the train split holds 10 tokens.*block_size 16"):
        _batches(tokens, sampling="random_shard")
    assert _batches(tokens, sampling="random").batch(0)[0].shape == (4, 16)


def test_a_split_reads_as_one_stream_across_shards_of_any_size():
    pieces = [np.arange(0, 5), np.arange(5, 40), np.arange(40, 41), np.arange(41, 200)]
    tokens = ShardedTokens(pieces)
    assert len(tokens) == 200
    for start, length in [(0, 5), (3, 17), (4, 2), (39, 3), (40, 30), (0, 200), (150, 50)]:
        np.testing.assert_array_equal(tokens.read(start, length), np.arange(start, start + length))
    x, y = TokenBatches(tokens, "val", batch_size=8, block_size=17, seed=0).batch(0)
    assert torch.equal(y, x + 1)


def _write_split(directory, split, pieces, prefix=""):
    directory.mkdir(exist_ok=True)
    for k, piece in enumerate(pieces):
        write_shard(directory / f"{prefix}{split}_{k:06d}.bin", piece)


@pytest.mark.parametrize("prefix", ["", "fineweb_"])
def test_numbered_shards_are_read_in_order_including_llmc_names(tmp_path, prefix):
    _write_split(tmp_path, "train", [np.arange(0, 300), np.arange(300, 1000)], prefix)
    _write_split(tmp_path, "val", [np.arange(7, 500)], prefix)
    train = load_split(tmp_path, "train", vocab_size=50304)
    np.testing.assert_array_equal(train.read(250, 100), np.arange(250, 350))
    assert len(load_split(tmp_path, "val", vocab_size=50304)) == 493


def test_single_file_and_numbered_layouts_together_are_refused(tmp_path):
    write_shard(tmp_path / "train.bin", np.arange(100))
    write_shard(tmp_path / "train_000000.bin", np.arange(100))
    with pytest.raises(ValueError, match="one layout"):
        load_split(tmp_path, "train", vocab_size=50304)


def test_directory_without_shards_of_a_split_names_it(tmp_path):
    write_shard(tmp_path / "train.bin", np.arange(100))
    with pytest.raises(FileNotFoundError, match="no val shards.*data.prepare"):
        load_split(tmp_path, "val", vocab_size=50304)


@pytest.mark.parametrize("damage, message", [("magic", "magic"), ("truncate", "truncated")])
def test_damaged_shard_is_named_at_start(tmp_path, damage, message):
    _write_split(tmp_path, "train", [np.arange(300), np.arange(300)])
    bad = tmp_path / "train_000001.bin"
    if damage == "magic":
        with open(bad, "r+b") as f:
            f.write(np.int32(7).tobytes())
    else:
        bad.write_bytes(bad.read_bytes()[:-10])
    with pytest.raises(ShardError, match=message) as err:
        load_split(tmp_path, "train", vocab_size=50304)
    assert str(bad) in str(err.value)


def test_split_smaller_than_one_batch_is_rejected_naming_the_file(tmp_path):
    write_shard(tmp_path / "val.bin", np.arange(60))
    tokens = load_split(tmp_path, "val", vocab_size=50304)
    with pytest.raises(ValueError, match="fewer than one batch") as err:
        TokenBatches(tokens, "val", batch_size=4, block_size=16, seed=0)
    assert str(tmp_path / "val.bin") in str(err.value)
    with pytest.raises(ValueError, match="fewer than one batch"):  # 2 ranks need twice the windows
        _batches(np.arange(4 * 16 + 1), rank=0, world_size=2)


def test_token_ids_beyond_the_vocabulary_are_rejected(tmp_path):
    write_shard(tmp_path / "train.bin", np.array([1, 2, 60000]))
    with pytest.raises(ValueError, match="60000"):
        load_split(tmp_path, "train", vocab_size=50304)


def test_large_shards_without_a_manifest_are_checked_on_a_sample_and_say_so(tmp_path, caplog):
    tokens = np.zeros(4_000_000, dtype=np.uint16)
    write_shard(tmp_path / "train.bin", tokens)
    with caplog.at_level(logging.INFO, logger="data.loader"):
        load_split(tmp_path, "train", vocab_size=50304)
    assert "sample" in caplog.text
    tokens[-1] = 60000  # the last block is always in the sample
    write_shard(tmp_path / "train.bin", tokens)
    with pytest.raises(ValueError, match="60000"):
        load_split(tmp_path, "train", vocab_size=50304)


def _copy_prepared(prepared_dir, tmp_path):
    for path in prepared_dir.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    return tmp_path


def test_a_model_whose_vocabulary_cannot_hold_the_corpus_ids_is_refused_in_one_line(prepared_dir):
    largest = read_manifest(prepared_dir)["max_token_id"]
    with pytest.raises(ValueError, match=rf"manifest\.json: the shards hold gpt2 token ids up to {largest}, but "
                                         rf"model\.vocab_size is {largest}: set model\.vocab_size to at least "
                                         rf"{largest + 1}") as refused:
        load_split(prepared_dir, "train", vocab_size=largest)
    assert "\n" not in str(refused.value)


def test_a_model_smaller_than_the_tokenizer_that_holds_every_id_of_the_corpus_is_taken(prepared_dir, tmp_path,
                                                                                        caplog):
    # GaLore's LLaMA embeds 32,000 of t5-base's 32,100 ids: the sentinel ids above them are never in a text.
    directory = _copy_prepared(prepared_dir, tmp_path)
    manifest = read_manifest(directory)
    write_manifest(directory, {**manifest, "vocab_size": manifest["max_token_id"] + 101})
    with caplog.at_level(logging.INFO, logger="data.loader"):
        tokens = load_split(directory, "train", vocab_size=manifest["max_token_id"] + 1)
    assert len(tokens) and f"gpt2 has {manifest['max_token_id'] + 101} ids" in caplog.text


def test_manifest_largest_token_id_is_checked_without_reading_the_shards(prepared_dir, tmp_path):
    directory = _copy_prepared(prepared_dir, tmp_path)
    manifest = read_manifest(directory)
    write_manifest(directory, {**manifest, "vocab_size": 100, "max_token_id": 60000})
    with pytest.raises(ValueError, match="60000"):
        load_split(directory, "train", vocab_size=50304)


def test_unfinished_preparation_names_the_command_that_resumes_it(prepared_dir, tmp_path):
    directory = _copy_prepared(prepared_dir, tmp_path)
    write_manifest(directory, {**read_manifest(directory), "complete": False, "command": "python -m data.prepare x"})
    with pytest.raises(ValueError, match="did not finish.*python -m data.prepare x"):
        load_split(directory, "train", vocab_size=50304)


def test_shard_missing_from_disk_or_manifest_is_named(prepared_dir, tmp_path):
    directory = _copy_prepared(prepared_dir, tmp_path)
    (directory / "train_000001.bin").unlink()
    with pytest.raises(ValueError, match="train_000001.bin"):
        load_split(directory, "train", vocab_size=50304)
    (directory / "manifest.json").write_text(json.dumps({"complete": True}))
    with pytest.raises(ValueError, match="not written by"):
        load_split(directory, "train", vocab_size=50304)


@pytest.mark.parametrize("sampling", MODES)
def test_build_batches_serves_a_prepared_directory(prepared_dir, english_documents, sampling):
    data_cfg = SimpleNamespace(name="custom", dir=str(prepared_dir), sampling=sampling)
    args = dict(batch_size=2, block_size=32, grad_accum_steps=1, seed=0, rank=0, world_size=1,
                device=torch.device("cpu"), vocab_size=50304)
    x, y = build_batches(data_cfg, "train", **args).batch(5)
    assert x.shape == y.shape == (2, 32)
    text = gpt2_encoding().decode(x[0].tolist())
    assert text.replace("<|endoftext|>", "") in "".join(english_documents)
    assert build_batches(data_cfg, "val", **args).batch(0)[0].shape == (2, 32)


def test_missing_data_directory_names_the_prepare_command(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=f"data.prepare files .* --out {tmp_path / 'nope'}"):
        resolve_data_dir("custom", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="data.dir"):
        resolve_data_dir("custom", None)
    monkeypatch.setenv("MARS_DATA_CACHE", str(tmp_path))
    python = re.escape(shlex.quote(sys.executable))  # this interpreter by its path: no venv need be activated
    with pytest.raises(FileNotFoundError, match=rf"`{python} -m data.prepare openwebtext`"):
        resolve_data_dir("openwebtext", None)
    with pytest.raises(FileNotFoundError, match=rf"`{python} -m data.prepare fineweb-edu`"):
        resolve_data_dir("fineweb-edu", None)
