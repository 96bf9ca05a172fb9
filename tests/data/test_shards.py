import json
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from data.prepare import files_source, prepare
from data.shards import HEADER_BYTES, SHARD_MAGIC, ShardChanged, ShardError, ShardFiles, read_shard, write_shard
from tests import warm_python
from training.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]


def test_shard_round_trip_keeps_tokens_and_llmc_header(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 50257, size=1001)
    path = tmp_path / "a.bin"
    write_shard(path, tokens)
    np.testing.assert_array_equal(read_shard(path), tokens)
    header = np.fromfile(path, dtype="<i4", count=3)
    assert header.tolist() == [SHARD_MAGIC, 1, 1001]
    assert path.stat().st_size == HEADER_BYTES + 2 * 1001
    assert not list(tmp_path.glob("*.tmp"))


def _corrupt(path, index, value):
    header = np.fromfile(path, dtype="<i4", count=256)
    header[index] = value
    with open(path, "r+b") as f:
        f.write(header.tobytes())


@pytest.mark.parametrize("index, value, message", [(0, 1234, "magic"), (1, 7, "version"), (2, 5000, "truncated")])
def test_bad_header_is_rejected_naming_the_file(tmp_path, index, value, message):
    path = tmp_path / "bad.bin"
    write_shard(path, np.arange(100))
    _corrupt(path, index, value)
    with pytest.raises(ShardError, match=message) as err:
        read_shard(path)
    assert str(path) in str(err.value)


def test_truncated_file_is_rejected(tmp_path):
    path = tmp_path / "cut.bin"
    write_shard(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ShardError, match="truncated"):
        read_shard(path)


def test_missing_and_empty_shards_are_rejected(tmp_path):
    with pytest.raises(ShardError, match="does not exist"):
        read_shard(tmp_path / "none.bin")
    write_shard(tmp_path / "empty.bin", np.array([], dtype=np.uint16))
    with pytest.raises(ShardError, match="no tokens"):
        read_shard(tmp_path / "empty.bin")


def test_tokens_outside_uint16_are_refused(tmp_path):
    with pytest.raises(ValueError, match="65535"):
        write_shard(tmp_path / "x.bin", np.array([70000]))


def shards_of(tmp_path, count):
    paths = [tmp_path / f"train_{k:06d}.bin" for k in range(count)]
    for k, path in enumerate(paths):
        write_shard(path, np.full(100, k))
    return paths


def test_a_split_reads_the_shards_it_opened_whatever_is_renamed_over_their_paths(tmp_path):
    paths = shards_of(tmp_path, 3)
    shards = ShardFiles(paths)
    write_shard(paths[0], np.full(100, 7))  # as data.prepare writes: a new file renamed over the path
    paths[1].unlink()
    assert [int(shards[k][0]) for k in range(3)] == [0, 1, 2]


def test_a_shard_past_those_a_split_keeps_open_stops_it_once_it_is_another_file(tmp_path):
    paths = shards_of(tmp_path, 6)
    shards = ShardFiles(paths, open_files=4)  # one map at a time, three shards kept open
    write_shard(paths[0], np.full(100, 7))
    write_shard(paths[5], np.full(100, 7))
    assert [int(shards[k][0]) for k in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(ShardChanged, match=f"{paths[5]} is no longer the file this run opened at its start") as err:
        shards[5]
    assert "`ulimit -n 280`" in str(err.value)  # a quarter of it: the six shards and 64 maps


@pytest.mark.slow
def test_a_run_whose_corpus_is_prepared_again_while_it_is_stopped_trains_on_the_corpus_it_started_with(
        tmp_path, english_documents):
    from tests.training.test_resume import complete_run, start_and_wait

    settings = {"split": "llm.c", "val_tokens": 2000, "shard_size": 500}  # 26 train shards, 4 val shards
    corpus, untouched = tmp_path / "corpus", tmp_path / "untouched"
    for out in (corpus, untouched):
        prepare(files_source([jsonl(tmp_path / "documents.jsonl", english_documents)]), out, workers=1, **settings)
    expected = train_losses(complete_run(tmp_path / "undisturbed", "data=custom", f"data.dir={untouched}"))

    run_dir = tmp_path / "run"
    # Stopped as a scheduler suspends a job, once it has read its data's record: before it read any shard.
    run = start_and_wait(run_dir, bool, "the run's first record", "data=custom", f"data.dir={corpus}")
    run.send_signal(signal.SIGSTOP)
    try:
        assert len(train_losses(read_metrics(run_dir))) < 8, "the run was stopped with most of its 16 steps done"
        again = warm_python.run([sys.executable, "-m", "data.prepare", "files",
                                 jsonl(tmp_path / "other.jsonl", english_documents[::-1]), "--out", corpus,
                                 "--overwrite", "--workers", "1", *(f"--{key.replace('_', '-')}={value}"
                                                                     for key, value in settings.items())],
                                cwd=REPO, timeout=300)
        assert again.returncode == 0, again.stderr
    finally:
        run.send_signal(signal.SIGCONT)
    assert run.wait(timeout=600) == 0, run.output.read_text()
    assert read_shard(corpus / "train_000000.bin").tolist() != read_shard(untouched / "train_000000.bin").tolist()
    assert train_losses(read_metrics(run_dir)) == expected


def jsonl(path, documents):
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    return path


def train_losses(records):
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}
