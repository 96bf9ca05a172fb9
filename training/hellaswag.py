"""The HellaSwag scorer the training loop runs every ``train.hellaswag_interval`` steps, and the items it scores;
``python -m evaluation.hellaswag`` scores a trained model with the same functions.

HellaSwag (Zellers et al., 2019, arXiv 1905.07830) zero-shot, scored as llm.c and nanoGPT score it. Each item is
a context and four endings, one of them right. Every ending is appended to the context (GPT-2 tokens; the ending
with its leading space) and the model scores the ending's tokens given all the tokens before them. The
prediction is the ending with the highest log-likelihood, summed over its tokens (``acc``) or averaged over them
(``acc_norm``, which does not penalise long endings; the number the MARS authors and llm.c report).

Items are read from the official JSONL files (rowanz/hellaswag ``data/hellaswag_val.jsonl``: 10,042 items with
``ctx``, ``endings`` and ``label`` among other keys).
"""
import contextlib
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from data.corpora import data_root
from data.tokenizer import gpt2_encoding

VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
NUM_ENDINGS = 4


@dataclass(frozen=True)
class Item:
    context: str
    endings: tuple[str, ...]
    label: int


def default_val_path() -> Path:
    return data_root() / "hellaswag" / "hellaswag_val.jsonl"


def load_items(path: str | os.PathLike, limit: int | None = None) -> list[Item]:
    """The first ``limit`` items (all if None) of a HellaSwag JSONL file."""
    items = []
    with open(path) as f:
        for line_number, line in enumerate(f, start=1):
            if limit is not None and len(items) >= limit:
                break
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                item = Item(context=row["ctx"], endings=tuple(row["endings"]), label=int(row["label"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{path}:{line_number} is not a HellaSwag item with ctx, endings and label "
                                 f"({err!r})") from None
            if len(item.endings) != NUM_ENDINGS or not 0 <= item.label < NUM_ENDINGS:
                raise ValueError(f"{path}:{line_number}: expected {NUM_ENDINGS} endings and a label in "
                                 f"0..{NUM_ENDINGS - 1}, got {len(item.endings)} endings and label {item.label}")
            items.append(item)
    return items


def render(item: Item) -> list[tuple[list[int], int]]:
    """The item's four candidates as (tokens of context + ending, number of context tokens)."""
    encoding = gpt2_encoding()
    context = encoding.encode_ordinary(item.context)
    # The space joins the two texts as GPT-2 saw them: " ending" is tokenized with its leading space.
    return [(context + encoding.encode_ordinary(" " + ending), len(context)) for ending in item.endings]


def pad_candidates(candidates: list[tuple[list[int], int]], max_length: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows padded with zeros on the right, and a mask that is 1 on the ending tokens only.

    A row longer than ``max_length`` (the model's context) loses its oldest context tokens; the ending is kept.
    """
    rows = []
    for tokens, context_length in candidates:
        ending_length = len(tokens) - context_length
        if max_length is not None and len(tokens) > max_length:
            if ending_length >= max_length:
                raise ValueError(f"an ending of {ending_length} tokens leaves no context within max_length "
                                 f"{max_length}")
            tokens = tokens[-max_length:]
        rows.append((tokens, ending_length))
    width = max(len(tokens) for tokens, _ in rows)
    token_rows = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (tokens, ending_length) in enumerate(rows):
        token_rows[i, : len(tokens)] = torch.tensor(tokens)
        mask[i, len(tokens) - ending_length : len(tokens)] = True
    return token_rows, mask


@torch.no_grad()
def ending_log_likelihoods(model, tokens: torch.Tensor, mask: torch.Tensor, autocast=contextlib.nullcontext()
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed and the per-token mean log-probability of the masked (ending) tokens.

    ``model`` maps token ids (rows, length) to ``(logits, _)`` with logits (rows, length, vocabulary), as ``GPT``
    does. Padding sits after every scored token, so causal attention never lets it change a score.
    """
    with autocast:
        logits, _ = model(tokens)
    # The token at position t is predicted by the logits at t - 1.
    scored = mask[:, 1:]
    row_of_token = torch.arange(len(tokens), device=tokens.device).unsqueeze(1).expand_as(scored)[scored]
    log_probs = -F.cross_entropy(logits[:, :-1][scored].float(), tokens[:, 1:][scored], reduction="none")
    total = torch.zeros(len(tokens), dtype=torch.float32, device=tokens.device).index_add_(0, row_of_token, log_probs)
    return total, total / scored.sum(dim=1)


def score_items(model, items: list[Item], device, autocast=contextlib.nullcontext(), batch_size: int = 16,
                max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(items, 4) summed and mean ending log-likelihoods, ``batch_size`` items (4x as many rows) per forward."""
    sums, means = [], []
    for start in range(0, len(items), batch_size):
        candidates = [candidate for item in items[start : start + batch_size] for candidate in render(item)]
        tokens, mask = pad_candidates(candidates, max_length)
        total, mean = ending_log_likelihoods(model, tokens.to(device), mask.to(device), autocast)
        sums.append(total.view(-1, NUM_ENDINGS).cpu())
        means.append(mean.view(-1, NUM_ENDINGS).cpu())
    return torch.cat(sums), torch.cat(means)


def correct_counts(model, items: list[Item], device, autocast=contextlib.nullcontext(), batch_size: int = 16,
                   max_length: int | None = None) -> tuple[int, int]:
    """How many ``items`` the summed and the per-token log-likelihood get right: counts, so ranks can add theirs."""
    if not items:
        return 0, 0
    was_training = model.training
    model.eval()
    try:
        sums, means = score_items(model, items, device, autocast, batch_size, max_length)
    finally:
        model.train(was_training)
    labels = torch.tensor([item.label for item in items])
    return int((sums.argmax(dim=1) == labels).sum()), int((means.argmax(dim=1) == labels).sum())


def training_items(path: str | None, limit: int | None) -> list[Item]:
    """The items train.py evaluates periodically (``train.hellaswag_file``, ``train.hellaswag_items``)."""
    path = Path(path).expanduser() if path else default_val_path()
    if not path.is_file():
        raise FileNotFoundError(f"train.hellaswag_interval is set but {path} does not exist: fetch it with "
                                f"`{shlex.quote(sys.executable)} -m evaluation.hellaswag --download --checkpoint ...` "
                                "or by hand (from "
                                f"{VAL_URL}), or point train.hellaswag_file at a copy")
    return load_items(path, limit)
