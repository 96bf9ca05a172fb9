"""C4 as the optimizer literature's LLaMA runs read it: ``python -m data.prepare c4``.

GaLore (jiaweizzhao/GaLore ``torchrun_main.py``), whose setting Fira, SPAM and the others report on, streams
``allenai/c4`` (``en``) shuffled with seed 42 (``:170-172``, validation ``:86-87``) and tokenizes each document
alone with ``t5-base`` (``:183-192``; ``peft_pretraining/dataloader.py:28-34``): cut to 256 tokens with ``</s>``
last, padded with ``<pad>`` to 256, never packed. Each document is thus one row of 256 tokens, and so it is
stored here (``manifest.json``'s ``rows``): the loader serves rows, and the loss skips the padding as their
labels do (``labels[labels == pad_idx] = -100``, ``:412-413``). The documents are taken by the same calls:
``datasets``' streaming ``load_dataset(...).shuffle(seed=42)`` and ``tokenizer(text, max_length=256,
truncation=True, padding="max_length")``.

- validation: the first documents of the shuffled validation split until their non-padding tokens exceed 10M
  (``target_eval_tokens``, ``:100-117``; they stop at whole evaluation batches, a few documents later);
- train: the first ``--train-documents`` of the shuffled train split, in that order (default 51.2M, the rows of
  the 1B preset's 100K steps of 512); ``data.sampling=sequential`` reads them once, in order, as their loader.

The Hub's files stream at prepare time only; ``--from DIR`` reads a local copy in the Hub's layout
(``DIR/en/c4-train.00000-of-01024.json.gz``, ...), and ``--tokenizer`` takes a saved tokenizer's directory. An
interrupted preparation resumes after its last finished shard, as the others (``data.prepare``).
"""
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from data.shards import RowLayout

log = logging.getLogger(__name__)

TOKENIZER = "t5-base"  # torchrun_main.py:183
ROW_TOKENS = 256  # --max_length, torchrun_main.py:42
SHUFFLE_SEED = 42  # torchrun_main.py:87 (validation) and :172 (train)
VAL_TOKENS = 10_000_000  # target_eval_tokens, torchrun_main.py:100
TRAIN_DOCUMENTS = 100_000 * 512  # the 1B preset: 100K steps of 512 rows (scripts/benchmark_c4/llama_1b.sh:9-10)
HUB_SPLITS = {"val": "validation", "train": "train"}
TOKENIZE_BATCH = 1000  # documents per call of the (Rust, multithreaded) tokenizer


@dataclass(frozen=True)
class C4Source:
    """Where the documents come from: the Hub, or a local copy of its files."""

    local: Path | None = None

    def files(self, split: str) -> list[Path]:
        """The local copy's files of ``split`` in name order, as the Hub lists them."""
        pattern = f"c4-{HUB_SPLITS[split]}.*.json*"
        for directory in (self.local / "en", self.local):
            found = sorted(directory.glob(pattern))
            if found:
                return found
        raise FileNotFoundError(f"{self.local} holds no C4 {HUB_SPLITS[split]} files ({self.local}/en/{pattern}): "
                                "give --from the directory of a copy of allenai/c4 (the one holding en/)")

    def settings(self) -> dict:
        if self.local is None:
            return {"hub": "allenai/c4", "config": "en", "text_column": "text"}
        files = [{"path": str(p.resolve()), "bytes": p.stat().st_size}
                 for split in HUB_SPLITS for p in self.files(split)]
        return {"hub": "allenai/c4", "config": "en", "text_column": "text", "local_copy": str(self.local.resolve()),
                "files": files}

    def documents(self, split: str) -> Iterator[str]:
        """The texts of ``split`` in GaLore's order: the streamed split shuffled with seed 42."""
        from datasets import load_dataset  # imports pandas and pyarrow: seconds, so only where it is used

        if self.local is None:
            stream = load_dataset("allenai/c4", "en", split=HUB_SPLITS[split], streaming=True)
        else:
            stream = load_dataset("json", data_files=[str(p) for p in self.files(split)], split="train",
                                  streaming=True)
        for row in stream.shuffle(seed=SHUFFLE_SEED):
            yield row["text"]


def tokenizer_reference(name: str) -> str:
    """What a manifest records of ``--tokenizer``: a saved tokenizer's directory as an absolute path, which names it
    from any directory (a run's or an export's error message repeats it); a Hub id as is."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.is_dir() else name


def load_tokenizer(name: str):
    """The tokenizer ``name`` (a Hub id, fetched once, or a saved tokenizer's directory), cut at 256 tokens."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError("preparing C4 tokenizes with transformers' t5-base: pip install -e '.[c4]'") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, model_max_length=ROW_TOKENS)
    except OSError as err:
        raise ValueError(f"cannot load the tokenizer {name!r} ({' '.join(str(err).split())[:160]}): it is fetched "
                         "from the Hub once (network), or give --tokenizer the directory of a saved one") from None
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise ValueError(f"the tokenizer {name!r} has no pad or end-of-sequence token, which each row needs "
                         "(t5-base: <pad> 0, </s> 1)")
    return tokenizer


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary: two tokenizers of one name (a saved copy, another version) that
    map any piece differently have other ones."""
    vocabulary = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()[:16]


def tokenize_rows(tokenizer, texts: list[str]) -> np.ndarray:
    """Each text's row of ``ROW_TOKENS`` ids, as GaLore's trainer tokenizes a document (torchrun_main.py:186-192)."""
    ids = tokenizer(texts, max_length=ROW_TOKENS, truncation=True, padding="max_length")["input_ids"]
    return np.array(ids, dtype=np.uint16).reshape(len(texts), ROW_TOKENS)


def c4_settings(source: C4Source, tokenizer_name: str, tokenizer, train_documents: int, val_tokens: int,
                shard_size: int) -> dict:
    """What a C4 corpus depends on: a rerun into its directory must match these to resume."""
    if shard_size % ROW_TOKENS:
        raise ValueError(f"--shard-size must hold whole rows of {ROW_TOKENS} tokens, got {shard_size}")
    if train_documents <= 0 or val_tokens <= 0:
        raise ValueError("--train-documents and --val-tokens must be positive")
    if len(tokenizer) > 65536:
        raise ValueError(f"the tokenizer {tokenizer_name!r} has {len(tokenizer):,} ids, more than the shards' uint16 "
                         "tokens hold (65,536)")
    rows = RowLayout(ROW_TOKENS, tokenizer.pad_token_id)
    return {"source": source.settings(), "tokenizer": tokenizer_name, "vocab_size": len(tokenizer),
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer), "eot_token": tokenizer.eos_token_id,
            "document_separator": f"each document its own row of {ROW_TOKENS} tokens: cut with "
                                  f"{tokenizer.eos_token} last, padded with {tokenizer.pad_token}",
            "rows": rows.as_manifest(),
            "split": {"rule": "galore", "seed": SHUFFLE_SEED, "val_tokens": val_tokens,
                      "train_documents": train_documents,
                      "description": f"GaLore's: validation's first documents (shuffled, seed {SHUFFLE_SEED}) "
                                     f"until over {val_tokens:,} non-padding tokens; train's first "
                                     f"{train_documents:,} (shuffled, seed {SHUFFLE_SEED}), in that order"},
            "shard_size": shard_size}


def write_c4_rows(writer, source: C4Source, tokenizer, settings: dict, progress: tqdm) -> int:
    """Write the validation rows, then the train rows, from the writer's position on; returns the documents
    written in all. The writer's shards say how far an interrupted run came (``ShardWriter``)."""
    shards = writer.manifest["shards"]
    pad = settings["rows"]["pad_token"]
    position = writer.next_document  # documents already in finished shards, validation first
    if any(s["split"] == "train" for s in shards):
        val_documents = sum(s["tokens"] for s in shards if s["split"] == "val") // ROW_TOKENS
    else:
        text_tokens = sum(s["text_tokens"] for s in shards if s["split"] == "val")
        val_documents = position
        for rows in _rows(source.documents("val"), tokenizer, skip=position):
            for row in rows:
                if text_tokens > settings["split"]["val_tokens"]:  # their check, before each batch (:107)
                    break
                writer.add("val", val_documents, row)
                text_tokens += int(np.count_nonzero(row != pad))
                val_documents += 1
                progress.update(1)
            else:
                continue
            break
    wanted = settings["split"]["train_documents"]
    done = max(0, position - val_documents)
    for rows in _rows(source.documents("train"), tokenizer, skip=done, limit=wanted):
        for row in rows:
            writer.add("train", val_documents + done, row)
            done += 1
            progress.update(1)
    writer.finish()
    if done < wanted:
        log.warning("C4's train split gave %s documents, fewer than --train-documents %s", f"{done:,}",
                    f"{wanted:,}")
    return val_documents + done


def _rows(texts: Iterator[str], tokenizer, skip: int, limit: int | None = None) -> Iterator[np.ndarray]:
    """Rows of the texts after the first ``skip`` (not tokenized), up to ``limit`` texts in all, a batch at a time."""
    batch = []
    for index, text in enumerate(texts):
        if limit is not None and index >= limit:
            break
        if index < skip:
            continue
        batch.append(text)
        if len(batch) == TOKENIZE_BATCH:
            yield tokenize_rows(tokenizer, batch)
            batch = []
    if batch:
        yield tokenize_rows(tokenizer, batch)
