import json

import pytest

from data.embedded import clean_play, play_files
from data.prepare import files_source, prepare

# Small enough for several shards from the documents below, some ending inside a document.
PREPARE_SETTINGS = {"shard_size": 3_000, "val_tokens": 2_000}


@pytest.fixture(scope="session")
def english_documents() -> list[str]:
    """About 80 documents of real English (speeches from one play, a few at a time), plus two awkward ones."""
    speeches = clean_play(play_files()[0].read_text(encoding="utf-8")).split("\n\n")[:320]
    documents = ["\n\n".join(speeches[k : k + 4]) for k in range(0, len(speeches), 4)]
    documents.insert(5, "Café, naïve, 東京 and 🎭: text outside ASCII survives the round trip.")
    documents.insert(9, "A document that mentions <|endoftext|> as plain text.")
    return documents


@pytest.fixture(scope="session")
def prepare_settings() -> dict:
    return dict(PREPARE_SETTINGS)


@pytest.fixture(scope="session")
def jsonl_corpus(tmp_path_factory, english_documents):
    path = tmp_path_factory.mktemp("corpus") / "documents.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for k, text in enumerate(english_documents):
            f.write(json.dumps({"id": k, "text": text}) + "\n")
    return path


@pytest.fixture(scope="session")
def prepared_dir(tmp_path_factory, jsonl_corpus):
    """The jsonl corpus prepared into val and train shards, as `python -m data.prepare files` would."""
    out = tmp_path_factory.mktemp("prepared")
    prepare(files_source([jsonl_corpus]), out, workers=1, **PREPARE_SETTINGS)
    return out
