import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import data.prepare
from data.loader import load_split
from data.prepare import files_source, main, prepare, split_rule
from data.shards import HEADER_INTS, SHARD_MAGIC, SHARD_VERSION, read_manifest, read_shard
from data.tokenizer import GPT2_EOT_TOKEN, GPT2_VOCAB_SIZE, gpt2_encoding
from tests import warm_python
from tests.shell import shell_without_the_venv

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


@pytest.mark.parametrize("rule, shards_before, split_before", [
    (dict(val_tokens=2_000), 3, "train"),
    (dict(val_tokens=7_000), 2, "val"),
    (dict(split="llm.c", val_tokens=2_000), 1, "val"),  # the val shard ends at the cut inside a document
    (dict(split="llm.c", val_tokens=7_000), 4, "train"),
    (dict(split="nanogpt", test_size=0.25), 2, "train"),
    (dict(split="nanogpt", test_size=0.25), 5, "val"),  # all train shards written, the val documents not all
])
def test_interrupted_prepare_resumes_after_its_last_shard_and_ends_identical(tmp_path, monkeypatch, jsonl_corpus,
                                                                            rule, shards_before, split_before):
    settings = dict(shard_size=3_000, workers=1, **rule)
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
    with pytest.raises(ValueError, match="all held out for validation"):
        prepare(files_source([jsonl_corpus]), tmp_path / "out", val_tokens=10**9, workers=1)


def test_one_large_text_file_gets_advice_that_works(tmp_path, english_documents):
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(english_documents))  # one document: whole documents cannot split it
    with pytest.raises(ValueError, match=r"rerun with `--split llm.c --val-tokens (\d+) --overwrite`") as refused:
        prepare(files_source([book]), tmp_path / "out", val_tokens=1_000, workers=1)
    advised = int(re.search(r"--val-tokens (\d+)", str(refused.value)).group(1))
    manifest = prepare(files_source([book]), tmp_path / "advised", split="llm.c", val_tokens=advised, workers=1)
    assert manifest["tokens"]["val"] == advised and manifest["tokens"]["train"] > 0


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


def test_rows_whose_text_is_null_or_not_a_string_are_skipped_and_counted_in_one_line(tmp_path, english_documents,
                                                                                     caplog):
    rows = [{"text": text} for text in english_documents[:6]]
    rows.insert(2, {"text": None})
    rows.insert(5, {"text": 5})
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    main(["files", str(path), "--out", str(tmp_path / "out"), "--workers", "1", "--val-tokens", "1000"])
    manifest = read_manifest(tmp_path / "out")
    assert manifest["documents"] == 6
    tokens = np.concatenate([split_tokens(tmp_path / "out", "val"), split_tokens(tmp_path / "out", "train")])
    assert gpt2_encoding().decode(tokens.tolist()) == "".join(EOT + d for d in english_documents[:6])
    skipped = [record.getMessage() for record in caplog.records if "skipped" in record.getMessage()]
    assert len(skipped) == 1 and "\n" not in skipped[0], skipped
    assert "skipped 2 row(s) whose 'text' is not a string" in skipped[0] and "row 3" in skipped[0], skipped


def test_a_directory_given_as_input_file_is_named_as_one_with_what_is_accepted(tmp_path, jsonl_corpus):
    with pytest.raises(SystemExit) as exit_info:
        main(["files", str(jsonl_corpus.parent), "--out", str(tmp_path / "out"), "--workers", "1"])
    message = exit_info.value.code
    assert message.startswith(f"error: input {jsonl_corpus.parent} is a directory: give the files in it"), message
    assert f"{jsonl_corpus.parent}/*.jsonl" in message and ".parquet" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_command_line_prepares_files_and_records_the_command(tmp_path, jsonl_corpus, prepared_dir,
                                                             prepare_settings):
    out = tmp_path / "out"
    main(["files", str(jsonl_corpus), "--out", str(out), "--shard-size", str(prepare_settings["shard_size"]),
          "--val-tokens", str(prepare_settings["val_tokens"]), "--workers", "1"])
    assert shard_bytes(out) == shard_bytes(prepared_dir)
    # The command kept runs as printed (what an unfinished preparation's error gives) from another directory, in a
    # shell without the venv activated.
    command = read_manifest(out)["command"]
    assert command.startswith(f"cd {shlex.quote(os.getcwd())} && {shlex.quote(sys.executable)} -m data.prepare files ")
    shutil.rmtree(out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = subprocess.run(["bash", "-c", command], cwd=elsewhere, env=shell_without_the_venv(), capture_output=True,
                         text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert shard_bytes(out) == shard_bytes(prepared_dir)
    with pytest.raises(SystemExit, match="--out"):
        main(["files", str(jsonl_corpus)])


# The validation split rules of the MARS authors' preparations.

NANOGPT_TEST_SIZE = 0.25  # about 20 of the 82 documents, so that the order of the val documents shows
NANOGPT_SEED = 2357


def encode(text):
    return gpt2_encoding().encode_ordinary(text)


def test_nanogpt_split_is_datasets_train_test_split_of_the_map_style_documents_with_eot_appended(
        tmp_path, jsonl_corpus, english_documents):
    out = tmp_path / "out"
    manifest = prepare(files_source([jsonl_corpus]), out, split="nanogpt", test_size=NANOGPT_TEST_SIZE,
                       shard_size=3_000, workers=1)
    # nanoGPT's data/openwebtext/prepare.py on the same documents, loaded map-style. (datasets is imported here,
    # not at collection, where every pytest worker would pay its second of import.)
    from datasets import load_dataset
    documents = load_dataset("json", data_files=str(jsonl_corpus), split="train", cache_dir=str(tmp_path / "hf"))
    parts = documents.train_test_split(test_size=NANOGPT_TEST_SIZE, seed=NANOGPT_SEED, shuffle=True)
    val_ids = list(parts["test"]["id"])
    assert val_ids != sorted(val_ids)  # the shuffled order, which the val split must keep
    val = [t for text in parts["test"]["text"] for t in [*encode(text), GPT2_EOT_TOKEN]]
    train_in_stream_order = [text for _, text in sorted(zip(parts["train"]["id"], parts["train"]["text"]))]
    train = [t for text in train_in_stream_order for t in [*encode(text), GPT2_EOT_TOKEN]]
    assert split_tokens(out, "val").tolist() == val
    assert split_tokens(out, "train").tolist() == train
    assert manifest["documents"] == len(english_documents)
    assert manifest["tokens"] == {"val": len(val), "train": len(train)}
    assert len(load_split(out, "val", GPT2_VOCAB_SIZE)) == len(val)  # the trainer finds the split


def llmc_shards(documents, shard_size):
    """The shard files llm.c's dev/data/fineweb.py writes for ``documents`` (its main loop, lines 96-143)."""
    files, shard_index, token_count = {}, 0, 0
    all_tokens_np = np.empty((shard_size,), dtype=np.uint16)

    def write_datafile(name, tokens):
        header = np.zeros(HEADER_INTS, dtype=np.int32)
        header[:3] = (SHARD_MAGIC, SHARD_VERSION, len(tokens))
        files[name] = header.tobytes() + np.array(tokens, dtype=np.uint16).tobytes()

    for text in documents:
        tokens = np.array([GPT2_EOT_TOKEN, *encode(text)], dtype=np.uint16)
        if token_count + len(tokens) < shard_size:
            all_tokens_np[token_count : token_count + len(tokens)] = tokens
            token_count += len(tokens)
        else:
            split = "val" if shard_index == 0 else "train"
            remainder = shard_size - token_count
            all_tokens_np[token_count : token_count + remainder] = tokens[:remainder]
            write_datafile(f"edu_fineweb_{split}_{shard_index:06d}.bin", all_tokens_np.tolist())
            shard_index += 1
            all_tokens_np[0 : len(tokens) - remainder] = tokens[remainder:]
            token_count = len(tokens) - remainder
    if token_count != 0:
        split = "val" if shard_index == 0 else "train"
        write_datafile(f"edu_fineweb_{split}_{shard_index:06d}.bin", all_tokens_np[:token_count].tolist())
    return files


def test_llmc_split_with_val_tokens_of_one_shard_writes_llmc_shards_byte_for_byte(tmp_path, jsonl_corpus,
                                                                                   english_documents):
    out = tmp_path / "out"
    prepare(files_source([jsonl_corpus]), out, split="llm.c", val_tokens=3_000, shard_size=3_000, workers=1)
    theirs = llmc_shards(english_documents, 3_000)
    assert len(theirs) >= 4

    def our_name(llmc_name):  # llm.c numbers its shards across both splits: its train shards start at 1
        split, index = llmc_name.removeprefix("edu_fineweb_").removesuffix(".bin").split("_")
        return f"{split}_{int(index) - (split == 'train'):06d}.bin"

    assert shard_bytes(out) == {our_name(name): data for name, data in theirs.items()}


def test_llmc_split_is_the_first_val_tokens_of_the_stream_cutting_a_document(tmp_path, jsonl_corpus,
                                                                               english_documents):
    val_tokens, out = 2_000, tmp_path / "out"
    manifest = prepare(files_source([jsonl_corpus]), out, split="llm.c", val_tokens=val_tokens, shard_size=3_000,
                       workers=1)
    stream = [t for text in english_documents for t in [GPT2_EOT_TOKEN, *encode(text)]]
    document_starts = np.cumsum([0] + [len(encode(text)) + 1 for text in english_documents])
    assert val_tokens not in document_starts  # the boundary falls inside a document
    assert split_tokens(out, "val").tolist() == stream[:val_tokens]
    assert split_tokens(out, "train").tolist() == stream[val_tokens:]
    train = [s["tokens"] for s in manifest["shards"] if s["split"] == "train"]
    assert all(tokens == 3_000 for tokens in train[:-1]) and len(train) >= 3


@pytest.mark.parametrize("rule", [dict(split="nanogpt", test_size=NANOGPT_TEST_SIZE),
                                  dict(split="llm.c", val_tokens=2_000)])
def test_two_workers_write_the_same_shards_as_one(tmp_path, jsonl_corpus, rule):
    for workers in (1, 2):
        prepare(files_source([jsonl_corpus]), tmp_path / str(workers), shard_size=3_000, workers=workers, **rule)
    assert shard_bytes(tmp_path / "1") == shard_bytes(tmp_path / "2")
    assert read_manifest(tmp_path / "1")["shards"] == read_manifest(tmp_path / "2")["shards"]


@pytest.mark.parametrize("rule, separator, description", [
    (dict(split="nanogpt", test_size=NANOGPT_TEST_SIZE), "<|endoftext|> after each document",
     "nanogpt: train_test_split(test_size=0.25, seed=2357, shuffle=True), EOT appended"),
    (dict(split="llm.c", val_tokens=2_000), "<|endoftext|> before each document",
     "llm.c: first 2,000 tokens (last document cut), EOT prepended"),
    (dict(val_tokens=2_000), "<|endoftext|> before each document",
     "first whole documents up to 2,000 tokens, EOT prepended"),
])
def test_manifest_names_the_split_rule_and_a_rerun_with_another_is_refused(tmp_path, jsonl_corpus, rule, separator,
                                                                           description):
    out = tmp_path / "out"
    prepare(files_source([jsonl_corpus]), out, shard_size=3_000, workers=1, **rule)
    manifest = read_manifest(out)
    assert manifest["split"]["rule"] == rule.get("split", "first-documents")
    assert manifest["split"]["description"].startswith(description)
    assert manifest["document_separator"] == separator
    other = dict(split="llm.c", val_tokens=2_000) if rule.get("split") != "llm.c" else dict(val_tokens=2_000)
    with pytest.raises(ValueError, match="different .*split"):
        prepare(files_source([jsonl_corpus]), out, shard_size=3_000, workers=1, **other)


@pytest.mark.parametrize("documents, message", [(83, "holds 82 documents, not the 83"),
                                                (81, "more than the 81 documents")])
def test_nanogpt_split_refuses_a_source_with_another_number_of_documents(tmp_path, jsonl_corpus, english_documents,
                                                                         documents, message):
    assert len(english_documents) == 82
    with pytest.raises(ValueError, match=message):
        prepare(files_source([jsonl_corpus]), tmp_path / "out", split="nanogpt", documents=documents, workers=1)


@pytest.mark.parametrize("name, options, message", [
    ("nanogpt", dict(val_tokens=100), "--val-tokens does not apply to the nanogpt split"),
    ("llm.c", dict(test_size=0.1), "--test-size applies to the nanogpt split only"),
    ("nanogpt", dict(test_size=1.5), r"--test-size must lie in \(0, 1\)"),
    ("random", {}, "unknown split rule 'random'"),
])
def test_split_options_that_do_not_apply_to_the_rule_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        split_rule(name, **options)


@pytest.mark.parametrize("argv, split, documents", [
    (["openwebtext"], "nanogpt", 8_013_769),
    (["fineweb-edu", "--sample", "sample-100BT"], "llm.c", None),
    (["fineweb-edu", "--split", "nanogpt"], "nanogpt", None),
    (["files", "x.jsonl"], "first-documents", None),
])
def test_each_source_defaults_to_the_split_of_its_reference_preparation(tmp_path, monkeypatch, argv, split,
                                                                         documents):
    (tmp_path / "x.jsonl").write_text("{}\n")
    calls = []
    monkeypatch.setattr(data.prepare, "prepare", lambda source, out, **options: calls.append(options))
    monkeypatch.chdir(tmp_path)
    main([*argv, "--out", str(tmp_path / "out")])
    assert (calls[0]["split"], calls[0]["documents"]) == (split, documents)


@pytest.mark.parametrize("name, content, phrases", [
    ("empty.jsonl", b"", ["is empty"]),
    ("notes.jsonl", b"not json\n", ["could not read the documents of", "one JSON object per line"]),
    ("latin1.txt", "caf\u00e9\n".encode("latin-1"), ["could not read the documents of", "UTF-8"]),
], ids=["empty", "mistyped", "undecodable"])
def test_an_empty_mistyped_or_undecodable_input_file_is_one_line_naming_it(tmp_path, name, content, phrases):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        main(["files", str(path), "--out", str(tmp_path / "out"), "--workers", "1"])
    message = exit_info.value.code
    assert message.startswith("error: ") and "\n" not in message and name in message
    assert all(phrase in message for phrase in phrases), message


@pytest.mark.slow
def test_an_unreadable_input_and_a_read_only_out_are_one_line(tmp_path, jsonl_corpus):
    from tests.test_one_line_errors import assert_one_line, environment, without_root_file_access

    unreadable = tmp_path / "unreadable.jsonl"
    unreadable.write_text('{"text": "hello"}\n')
    unreadable.chmod(0)
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    prefix = without_root_file_access()
    for paths, out, phrase in (([unreadable], tmp_path / "out", str(unreadable)),
                               ([jsonl_corpus], read_only / "out", str(read_only / "out"))):
        result = warm_python.run([*prefix, sys.executable, "-m", "data.prepare", "files", *map(str, paths), "--out",
                                  str(out), "--workers", "1"], timeout=300,
                                 env=environment({"HF_DATASETS_OFFLINE": "1"}), cwd=Path(__file__).parents[2])
        assert_one_line(result, phrase, "Permission denied")


def test_a_full_disk_while_a_shard_is_written_is_one_line_and_leaves_no_partial_file(tmp_path, jsonl_corpus):
    out = tmp_path / "out"
    out.mkdir()
    # The shard's temporary file, this process's own: every write gets ENOSPC.
    (out / f"val_000000.bin.{socket.gethostname()}-{os.getpid()}.tmp").symlink_to("/dev/full")
    with pytest.raises(SystemExit) as exit_info:
        main(["files", str(jsonl_corpus), "--out", str(out), "--workers", "1", "--shard-size", "3000"])
    message = exit_info.value.code
    assert message.startswith(f"error: could not read or write {out} (No space left on device)"), message
    assert "rerun the command" in message and "\n" not in message
    assert not list(out.glob("*.tmp")) and not list(out.glob("*.bin"))


REPO = Path(__file__).resolve().parents[2]


def prepare_command(*args):
    return warm_python.run([sys.executable, "-m", "data.prepare", "files", *map(str, args), "--workers", "1"],
                           cwd=REPO, timeout=300)


@pytest.mark.slow
def test_a_small_text_file_gets_split_advice_that_trains_and_overwrite_replaces_the_corpus_whole(
        tmp_path, jsonl_corpus, english_documents, prepare_settings):
    out = tmp_path / "out"
    earlier = prepare_command(jsonl_corpus, "--out", out, "--shard-size", prepare_settings["shard_size"],
                              "--val-tokens", prepare_settings["val_tokens"])
    assert earlier.returncode == 0, earlier.stderr
    earlier_shards = shard_bytes(out)
    small = tmp_path / "small.txt"
    small.write_text("\n\n".join(english_documents[:12]))  # one document of a few thousand tokens
    refused = prepare_command(small, "--out", out)
    assert refused.returncode == 1 and "add --overwrite to replace it" in refused.stderr, refused.stderr
    failed = prepare_command(small, "--out", out, "--overwrite")  # the default split holds the one document out
    assert failed.returncode == 1 and shard_bytes(out) == earlier_shards  # the earlier corpus is whole
    advice = re.search(r"rerun with `(--split llm.c --val-tokens \d+ --overwrite)`", failed.stderr)
    assert advice, failed.stderr
    advised = prepare_command(small, "--out", out, *advice.group(1).split())
    assert advised.returncode == 0, advised.stderr
    manifest = read_manifest(out)
    assert sorted(p.name for p in out.glob("*.bin")) == sorted(shard["file"] for shard in manifest["shards"])
    assert manifest["source"]["files"][0]["path"].endswith("small.txt") and sorted(tmp_path.iterdir()) == [out, small]
    # The trainer's defaults (train.batch_size, train.block_size) read both splits.
    run = warm_python.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'run'}", "data=custom",
                           f"data.dir={out}", "train.device=cpu", "train.max_iters=1", "train.eval_iters=1"],
                          cwd=REPO, timeout=300)
    assert run.returncode == 0, run.stderr


def test_overwrite_refuses_a_directory_this_script_did_not_make(tmp_path, jsonl_corpus):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="has no manifest.json: choose another --out"):
        prepare(files_source([jsonl_corpus]), tmp_path, workers=1, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("stopped", ["between the renames", "before deleting the old corpus"])
def test_an_overwrite_stopped_while_it_replaced_the_corpus_is_finished_by_the_next_prepare(
        tmp_path, jsonl_corpus, english_documents, prepare_settings, monkeypatch, stopped):
    out, settings = tmp_path / "out", dict(shard_size=prepare_settings["shard_size"], workers=1)
    prepare(files_source([jsonl_corpus]), out, val_tokens=prepare_settings["val_tokens"], **settings)
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": text}) + "\n" for text in english_documents[:30]))
    expected = prepare(files_source([small]), tmp_path / "expected", val_tokens=2000, **settings)

    rename, rmtree = Path.rename, data.prepare.shutil.rmtree
    def killed_rename(self, target):  # the process dies as the new corpus is moved into place
        if self.name == "out.overwriting":
            raise KeyboardInterrupt
        return rename(self, target)
    def killed_rmtree(path, *args, **kwargs):  # ... or as the old one is deleted
        if Path(path).name == "out.replaced":
            raise KeyboardInterrupt
        return rmtree(path, *args, **kwargs)
    if stopped == "between the renames":
        monkeypatch.setattr(Path, "rename", killed_rename)
    else:
        monkeypatch.setattr(data.prepare.shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        prepare(files_source([small]), out, val_tokens=2000, overwrite=True, **settings)
    monkeypatch.undo()
    assert (tmp_path / "out.replaced").is_dir()

    monkeypatch.setattr(data.prepare, "_write_documents", lambda *args: pytest.fail("tokenized again"))
    manifest = prepare(files_source([small]), out, val_tokens=2000, overwrite=True, **settings)
    assert manifest["tokens"] == expected["tokens"] and shard_bytes(out) == shard_bytes(tmp_path / "expected")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["expected", "out", "small.jsonl"]


@pytest.mark.parametrize("name_bytes", [247, 255])
def test_an_out_whose_name_is_near_the_file_systems_limit_is_prepared_and_overwritten(tmp_path, jsonl_corpus,
                                                                                       name_bytes):
    # <out>.overwriting, <out>.replaced and <out>.lock would pass the 255 bytes a name may have.
    out = tmp_path / ("d" * name_bytes)
    small = tmp_path / "small.jsonl"
    small.write_text(jsonl_corpus.read_text().split("\n", 30)[-1])
    for source, extra in ((jsonl_corpus, []), (small, ["--overwrite"])):
        main(["files", str(source), "--out", str(out), "--workers", "1", "--shard-size", "3000",
              "--val-tokens", "2000", *extra])
        assert read_manifest(out)["source"]["files"][0]["path"] == str(source)
    assert sorted(tmp_path.iterdir()) == sorted([small, out])  # nothing left beside it


def test_an_out_whose_name_is_past_the_file_systems_limit_is_refused_naming_its_length(tmp_path, jsonl_corpus):
    with pytest.raises(SystemExit) as exit_info:
        main(["files", str(jsonl_corpus), "--out", str(tmp_path / ("d" * 256)), "--workers", "1"])
    assert exit_info.value.code.startswith("error: a name of 256 bytes (dddd"), exit_info.value.code
    assert "longer than the file system takes (255 bytes): choose a shorter --out" in exit_info.value.code
