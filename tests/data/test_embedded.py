import sys

import pytest

from data.embedded import VAL_PLAYS, clean_play, play_files
from data.shards import read_shard
from data.tokenizer import GPT2_EOT_TOKEN, gpt2_encoding
from tests import warm_python


def test_embedded_corpus_is_over_a_million_tokens_of_shakespeare(embedded_corpus_cache):
    train = read_shard(embedded_corpus_cache / "train.bin")
    val = read_shard(embedded_corpus_cache / "val.bin")
    assert len(train) > 1_000_000 and len(val) > 50_000
    val_text = gpt2_encoding().decode(val.tolist())
    assert "To be, or not to be" in val_text  # Hamlet is held out
    assert "*" not in val_text and "#" not in val_text


def test_val_plays_are_held_out_of_train(embedded_corpus_cache):
    train_text = gpt2_encoding().decode(read_shard(embedded_corpus_cache / "train.bin")[:2_000_000].tolist())
    assert "To be, or not to be" not in train_text
    assert {p.stem for p in play_files()} >= set(VAL_PLAYS)
    assert len(play_files()) == 38


def test_plays_are_separated_by_end_of_text(embedded_corpus_cache):
    val = read_shard(embedded_corpus_cache / "val.bin")
    assert (val == GPT2_EOT_TOKEN).sum() == len(VAL_PLAYS)


def test_markdown_marks_are_stripped():
    assert clean_play("## ACT I\n**HAMLET**  \n_Enter Ghost_\n") == "ACT I\nHAMLET\nEnter Ghost\n"


@pytest.mark.parametrize("command", [["train.py", "train.device=cpu"], ["-m", "data.prepare", "openwebtext"]],
                         ids=["train", "prepare"])
def test_a_read_only_home_without_mars_data_cache_is_one_line_naming_the_variable(tmp_path, command):
    from tests.test_one_line_errors import REPO, assert_one_line, environment, without_root_file_access

    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)  # as a cluster's home directory can be on its compute nodes
    script = [str(REPO / command[0]), *command[1:]] if command[0].endswith(".py") else command
    result = warm_python.run([*without_root_file_access(), sys.executable, *script], cwd=tmp_path, timeout=300,
                             env=environment({"HOME": str(home), "MARS_DATA_CACHE": None, "XDG_CACHE_HOME": None}))
    assert_one_line(result, f"cannot write {home / '.cache'} (Permission denied)", "set MARS_DATA_CACHE to a directory",
                    f"now unset, so the cache is {home / '.cache' / 'mars-gpt2'}")
