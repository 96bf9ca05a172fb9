import numpy as np
import pytest

from data.shards import HEADER_BYTES, SHARD_MAGIC, ShardError, read_shard, write_shard


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
