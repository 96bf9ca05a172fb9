import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import data.prepare
from data.prepare import files_source, main, prepare
from data.shards import read_manifest, read_shard
from data.tokenizer import GPT2_EOT_TOKEN, GPT2_VOCAB_SIZE, gpt2_encoding

EOT = "<|endoftext|>"
OLD_MTIME = 1_000_000_000  # shards stamped with this before a rerun still carry it if the rerun left them alone


def shard_bytes(out):
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.bin"))}


def split_tokens(out, split):
    manifest = read_manifest(out)
    shards = [read_shard(out / s["file"]) for s in manifest["shards"] if s["split"] == split]
    return np.concatenate(shards)


def test_jsonl_becomes_shards_whose_text_is_the_documents_each_preceded_by_eot(prepared_dir, english_documents):
    manifest = read_manifest(prepared_dir)
    assert manifest["complete"] and manifest["documents"] == len(english_documents)
    assert (manifest["tokenizer"], manifest["vocab_size"]) == ("gpt2", GPT2_VOCAB_SIZE)
    val, train = split_tokens(prepared_dir, "val"), split_tokens(prepared_dir, "train")
    assert manifest["tokens"] == {"val": len(val), "train": len(train)}
    decoded = gpt2_encoding().decode(np.concatenate([val, train]).tolist())
    assert decoded == "".join(EOT + d for d in english_documents)
    # The literal "<|endoftext|>" inside a document is ordinary text, not the separator.
    assert (np.concatenate([val, train]) == GPT2_EOT_TOKEN).sum() == len(english_documents)
    assert manifest["max_token_id"] == max(int(val.max()), int(train.max()))


def test_val_split_is_the_first_whole_documents_up_to_val_tokens(prepared_dir, english_documents,
                                                                  prepare_settings):
    val_text = gpt2_encoding().decode(split_tokens(prepared_dir, "val").tolist())
    held_out = val_text.count(EOT) - 1  # one document mentions the separator as text
    assert val_text == "".join(EOT + d for d in english_documents[:held_out])
    val_tokens = prepare_settings["val_tokens"]
    assert val_tokens <= len(split_tokens(prepared_dir, "val")) < val_tokens + 1_000


def test_train_shards_are_full_except_the_last_and_may_split_a_document(prepared_dir, prepare_settings):
    train = [s for s in read_manifest(prepared_dir)["shards"] if s["split"] == "train"]
    assert [s["file"] for s in train] == [f"train_{k:06d}.bin" for k in range(len(train))]
    assert len(train) >= 3
    shard_size = prepare_settings["shard_size"]
    assert all(s["tokens"] == shard_size for s in train[:-1]) and 0 < train[-1]["tokens"] <= shard_size
    assert any(s["next_offset"] > 0 for s in train)
    assert sorted(p.name for p in prepared_dir.iterdir()) == sorted(
        ["manifest.json"] + [s["file"] for s in read_manifest(prepared_dir)["shards"]])


def test_parquet_with_two_workers_gives_the_same_shards_as_jsonl_with_one(tmp_path, prepared_dir, english_documents,
                                                                          prepare_settings):
    path = tmp_path / "documents.parquet"
    pq.write_table(pa.table({"text": english_documents, "url": ["x"] * len(english_documents)}), path)
    out = tmp_path / "out"
    prepare(files_source([path]), out, workers=2, **prepare_settings)
    assert shard_bytes(out) == shard_bytes(prepared_dir)


def test_each_text_file_is_one_document(tmp_path, english_documents):
    paths = []
    for k, text in enumerate(english_documents[:3]):
        paths.append(tmp_path / f"doc{k}.txt")
        paths[-1].write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    prepare(files_source(paths), out, val_tokens=10, workers=1)
    tokens = np.concatenate([split_tokens(out, "val"), split_tokens(out, "train")])
    assert gpt2_encoding().decode(tokens.tolist()) == "".join(EOT + d for d in english_documents[:3])


def _interrupt_after(monkeypatch, shards_written):
    """Make prepare die like a killed process while writing shard number ``shards_written``."""
    real_write_shard, calls = data.prepare.write_shard, []

    def write_shard(path, tokens):
        if len(calls) == shards_written:
            path.with_name(path.name + ".tmp").write_bytes(b"half a shard")
            raise KeyboardInterrupt
        calls.append(path)
        real_write_shard(path, tokens)

    monkeypatch.setattr(data.prepare, "write_shard", write_shard)


@pytest.mark.parametrize("val_tokens, shards_before, split_before", [(2_000, 3, "train"), (7_000, 2, "val")])
def test_interrupted_prepare_resumes_after_its_last_shard_and_ends_identical(tmp_path, monkeypatch, jsonl_corpus,
                                                                            val_tokens, shards_before,
                                                                            split_before):
    settings = dict(shard_size=3_000, val_tokens=val_tokens, workers=1)
    prepare(files_source([jsonl_corpus]), tmp_path / "uninterrupted", **settings)
    out = tmp_path / "out"
    _interrupt_after(monkeypatch, shards_before)
    with pytest.raises(KeyboardInterrupt):
        prepare(files_source([jsonl_corpus]), out, **settings)
    monkeypatch.undo()
    finished = read_manifest(out)["shards"]
    assert not read_manifest(out)["complete"] and len(finished) == shards_before
    assert finished[-1]["split"] == split_before and finished[-1]["next_offset"] > 0  # inside a document
    for shard in finished:
        os.utime(out / shard["file"], (OLD_MTIME, OLD_MTIME))

    prepare(files_source([jsonl_corpus]), out, **settings)
    assert shard_bytes(out) == shard_bytes(tmp_path / "uninterrupted")
    assert read_manifest(out) == read_manifest(tmp_path / "uninterrupted")
    assert all((out / s["file"]).stat().st_mtime == OLD_MTIME for s in finished)
    assert not list(out.glob("*.tmp"))


def test_a_deleted_shard_is_made_again_from_its_recorded_position(tmp_path, jsonl_corpus, prepared_dir,
                                                                  prepare_settings):
    out, settings = tmp_path / "out", dict(workers=1, **prepare_settings)
    prepare(files_source([jsonl_corpus]), out, **settings)
    manifest = read_manifest(out)
    manifest["complete"] = False  # as if killed before the last shard was recorded as finished
    (out / "manifest.json").write_text(json.dumps(manifest))
    last = out / manifest["shards"][-1]["file"]
    last.unlink()
    for shard in manifest["shards"][:-1]:
        os.utime(out / shard["file"], (OLD_MTIME, OLD_MTIME))

    prepare(files_source([jsonl_corpus]), out, **settings)
    assert shard_bytes(out) == shard_bytes(prepared_dir)
    assert all((out / s["file"]).stat().st_mtime == OLD_MTIME for s in manifest["shards"][:-1])


def test_finished_directory_is_left_alone(prepared_dir, jsonl_corpus, prepare_settings):
    before = {p.name: p.stat().st_mtime_ns for p in prepared_dir.iterdir()}
    prepare(files_source([jsonl_corpus]), prepared_dir, workers=1, **prepare_settings)
    assert {p.name: p.stat().st_mtime_ns for p in prepared_dir.iterdir()} == before


def test_rerun_with_other_settings_is_refused_naming_them(prepared_dir, jsonl_corpus, prepare_settings):
    with pytest.raises(ValueError, match="shard_size"):
        prepare(files_source([jsonl_corpus]), prepared_dir, shard_size=prepare_settings["shard_size"] * 2,
                val_tokens=prepare_settings["val_tokens"])


def test_directory_of_foreign_shards_is_refused(tmp_path, jsonl_corpus):
    (tmp_path / "train.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="no manifest.json"):
        prepare(files_source([jsonl_corpus]), tmp_path, workers=1)


def test_corpus_smaller_than_the_val_split_is_refused(tmp_path, jsonl_corpus):
    with pytest.raises(ValueError, match="lower --val-tokens"):
        prepare(files_source([jsonl_corpus]), tmp_path / "out", val_tokens=10**9, workers=1)


def test_missing_text_column_is_named(tmp_path, jsonl_corpus):
    with pytest.raises(ValueError, match="'body'.*--text-column"):
        prepare(files_source([jsonl_corpus], text_column="body"), tmp_path / "out", workers=1)


@pytest.mark.parametrize("name, message", [("notes.csv", "unsupported file type"), ("none.txt", "does not exist")])
def test_bad_input_files_are_named(tmp_path, name, message):
    if name.endswith(".csv"):
        (tmp_path / name).write_text("a,b\n")
    with pytest.raises((ValueError, FileNotFoundError), match=message) as err:
        files_source([tmp_path / name])
    assert name in str(err.value)


def test_command_line_prepares_files_and_records_the_command(tmp_path, jsonl_corpus, prepared_dir,
                                                             prepare_settings):
    out = tmp_path / "out"
    main(["files", str(jsonl_corpus), "--out", str(out), "--shard-size", str(prepare_settings["shard_size"]),
          "--val-tokens", str(prepare_settings["val_tokens"]), "--workers", "1"])
    assert shard_bytes(out) == shard_bytes(prepared_dir)
    assert read_manifest(out)["command"].startswith("python -m data.prepare files ")
    with pytest.raises(SystemExit, match="--out"):
        main(["files", str(jsonl_corpus)])
