from data.embedded import VAL_PLAYS, clean_play, play_files
from data.shards import read_shard
from data.tokenizer import GPT2_EOT_TOKEN, gpt2_encoding


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
