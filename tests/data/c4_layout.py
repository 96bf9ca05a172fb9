"""A small local C4 in the Hub's layout and a tokenizer shaped as t5-base, made here without a network.

``c4_copy`` writes ``en/c4-train.0000k-of-00002.json.gz`` and ``en/c4-validation.00000-of-00001.json.gz`` (one
JSON object per line with C4's fields: text, timestamp, url) from Shakespeare's lines (the embedded corpus's
package). ``t5_like_tokenizer`` trains a small Unigram tokenizer on them with t5-base's special tokens and
behaviour: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, ``</s>`` appended to each text, saved where
``AutoTokenizer.from_pretrained`` loads it.
"""
import gzip
import json
from pathlib import Path

from data.embedded import clean_play, play_files


def c4_documents(count: int, lines_per_document: tuple[int, ...] = (3, 40, 9, 120, 1)) -> list[str]:
    """``count`` documents of Shakespeare's lines, of lengths cycling through ``lines_per_document``: short ones
    padded in their row, long ones cut."""
    lines = [line for play in play_files()[:4] for line in clean_play(play.read_text()).splitlines() if line.strip()]
    documents, at = [], 0
    for k in range(count):
        take = lines_per_document[k % len(lines_per_document)]
        documents.append("\n".join(lines[at:at + take]))
        at = (at + take) % (len(lines) - max(lines_per_document))
    return documents


def c4_copy(root: Path, train: list[str], validation: list[str], train_files: int = 2) -> Path:
    """A copy of C4's layout under ``root``: ``root/en/c4-{split}.{k:05d}-of-{n:05d}.json.gz``."""
    (root / "en").mkdir(parents=True, exist_ok=True)
    for split, documents, files in (("train", train, train_files), ("validation", validation, 1)):
        for k in range(files):
            with gzip.open(root / "en" / f"c4-{split}.{k:05d}-of-{files:05d}.json.gz", "wt") as f:
                for n, text in enumerate(documents[k::files]):
                    f.write(json.dumps({"text": text, "timestamp": "2019-04-25T12:57:54Z",
                                        "url": f"https://example.org/{split}/{k}/{n}"}) + "\n")
    return root


def t5_like_tokenizer(directory: Path, texts: list[str], vocab_size: int = 400) -> Path:
    """A Unigram tokenizer trained on ``texts`` with t5-base's special tokens, saved in ``directory``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts, trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>"))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>",
                                      unk_token="<unk>")
    wrapped.save_pretrained(directory)
    return directory
