"""HellaSwag scoring: rendering, masking, the two accuracies, and the CLI on a checkpoint written like train.py's."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from data.tokenizer import gpt2_encoding
from evaluation.hellaswag import evaluate_hellaswag, main
from training.hellaswag import Item, load_items, pad_candidates, render, score_items
from model import ARCHITECTURES
from tests.tiny_models import tiny_model
from training.checkpoint import save_checkpoint

SAMPLE = Path(__file__).parent / "hellaswag_sample.jsonl"
VOCAB = 50304


class FixedPreferences(nn.Module):
    """A stub language model: the same next-token logits at every position, 0 except for chosen tokens."""

    def __init__(self, preferred: dict[int, float]):
        super().__init__()
        logits = torch.zeros(VOCAB)
        for token, logit in preferred.items():
            logits[token] = logit
        self.register_buffer("logits", logits)

    def forward(self, idx, targets=None):
        return self.logits.expand(*idx.shape, VOCAB), None


def tokens_of(text: str) -> list[int]:
    return gpt2_encoding().encode_ordinary(text)


def tiny_gpt(block_size: int = 64, arch: str = "gpt2") -> torch.nn.Module:
    return tiny_model(arch, n_embd=32, block_size=block_size, vocab_size=50304).eval()


def test_items_load_from_the_official_jsonl_format():
    items = load_items(SAMPLE)
    assert [item.label for item in items] == [2, 0, 3]
    assert items[0].context == "A woman pours flour into a large glass bowl. she"
    assert items[0].endings[2] == "cracks two eggs over the bowl and stirs the mixture with a spoon."
    assert len(load_items(SAMPLE, limit=2)) == 2


def test_malformed_item_is_rejected_naming_its_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = SAMPLE.read_text().splitlines()[0]
    path.write_text(good + "\n" + json.dumps({"ctx": "x", "endings": ["a", "b"], "label": 0}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2.*4 endings"):
        load_items(path)


def test_each_candidate_is_the_context_then_the_ending_with_its_leading_space():
    item = load_items(SAMPLE)[0]
    context = tokens_of(item.context)
    for (tokens, context_length), ending in zip(render(item), item.endings):
        assert context_length == len(context)
        assert tokens == context + tokens_of(" " + ending)


def test_only_ending_tokens_are_masked_in_and_padding_is_masked_out():
    candidates = [([1, 2, 3, 4, 5], 3), ([1, 2, 3, 9], 3)]
    tokens, mask = pad_candidates(candidates)
    assert tokens.tolist() == [[1, 2, 3, 4, 5], [1, 2, 3, 9, 0]]
    assert mask.tolist() == [[False, False, False, True, True], [False, False, False, True, False]]


def test_rows_longer_than_the_context_window_drop_their_oldest_context_tokens():
    tokens, mask = pad_candidates([(list(range(10, 20)), 7)], max_length=5)
    assert tokens.tolist() == [[15, 16, 17, 18, 19]]
    assert mask.tolist() == [[False, False, True, True, True]]
    with pytest.raises(ValueError, match="max_length"):
        pad_candidates([(list(range(10)), 2)], max_length=8)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_scores_are_the_log_probabilities_of_the_ending_tokens_given_what_precedes_them(arch):
    model = tiny_gpt(arch=arch)
    item = load_items(SAMPLE)[1]
    sums, means = score_items(model, [item], "cpu", batch_size=1)
    for k, (tokens, context_length) in enumerate(render(item)):
        with torch.no_grad():
            logits, _ = model(torch.tensor([tokens]))
        log_probs = F.log_softmax(logits[0].double(), dim=-1)
        expected = sum(log_probs[t - 1, tokens[t]].item() for t in range(context_length, len(tokens)))
        assert sums[0, k].item() == pytest.approx(expected, abs=1e-4)
        assert means[0, k].item() == pytest.approx(expected / (len(tokens) - context_length), abs=1e-4)


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_batching_and_padding_leave_the_scores_unchanged(arch):
    model, items = tiny_gpt(arch=arch), load_items(SAMPLE)
    one_by_one = score_items(model, items, "cpu", batch_size=1)
    all_at_once = score_items(model, items, "cpu", batch_size=3)
    for single, batched in zip(one_by_one, all_at_once):
        torch.testing.assert_close(single, batched, atol=1e-4, rtol=0)


def test_a_model_that_prefers_the_right_ending_picks_it():
    items = load_items(SAMPLE)
    # Unlikely tokens for the wrong endings, likely ones for the right ending (which wins the tokens they share).
    preferred = {token: -8.0 for item in items for k, ending in enumerate(item.endings) if k != item.label
                 for token in tokens_of(" " + ending)}
    preferred.update({token: 8.0 for item in items for token in tokens_of(" " + item.endings[item.label])})
    scores = evaluate_hellaswag(FixedPreferences(preferred), items, "cpu")
    assert scores == {"acc": 1.0, "acc_norm": 1.0, "items": 3}
    # The same model turned around picks a wrong ending every time.
    inverted = FixedPreferences({token: -logit for token, logit in preferred.items()})
    assert evaluate_hellaswag(inverted, items, "cpu") == {"acc": 0.0, "acc_norm": 0.0, "items": 3}


def test_acc_prefers_short_endings_where_acc_norm_prefers_likely_tokens():
    short, long = " yes", " purple cats dance slowly"
    item = Item(context="The answer is", endings=(short, long, " green red", " blue orange"), label=1)
    rendered = [set(tokens_of(ending)) for ending in item.endings]
    assert len(rendered[0]) == 1 and len(rendered[1]) == 4 and all(len(r) >= 2 for r in rendered[2:])
    assert not set.intersection(*rendered[:2]) and all(not (rendered[1] & r) for r in rendered[2:])
    # Per token: the long ending's tokens are likelier (logit 8) than the one-token short ending's (logit 6),
    # but four of them add up to less; the other endings' tokens (logit 0) are unlikely either way.
    model = FixedPreferences({**{t: 6.0 for t in rendered[0]}, **{t: 8.0 for t in rendered[1]}})
    assert evaluate_hellaswag(model, [item], "cpu") == {"acc": 0.0, "acc_norm": 1.0, "items": 1}
    assert evaluate_hellaswag(model, [dataclasses.replace(item, label=0)], "cpu")["acc"] == 1.0


def test_evaluation_restores_training_mode():
    model = tiny_gpt().train()
    evaluate_hellaswag(model, load_items(SAMPLE, limit=1), "cpu")
    assert model.training


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint as train.py writes it: the model's state_dict and the composed config as a plain dict."""
    model = tiny_gpt(block_size=32)
    config = {"model": dataclasses.asdict(model.config), "train": {"max_iters": 1}}
    return save_checkpoint(tmp_path, 1, {"model": model.state_dict(), "config": config, "step": 1}, keep=1), model


def test_cli_scores_a_checkpoint_like_the_library_does(checkpoint, capsys):
    path, model = checkpoint
    main(["--checkpoint", str(path), "--data", str(SAMPLE), "--limit", "2", "--device", "cpu"])
    printed = json.loads(capsys.readouterr().out)
    expected = evaluate_hellaswag(model, load_items(SAMPLE, limit=2), "cpu", max_length=32)
    assert printed == {"checkpoint": str(path), "data": str(SAMPLE), **expected}


def test_cli_takes_a_run_directory_for_its_newest_checkpoint(checkpoint, capsys):
    path, _ = checkpoint
    main(["--checkpoint", str(path.parents[1]), "--data", str(SAMPLE), "--device", "cpu"])
    assert json.loads(capsys.readouterr().out)["items"] == 3


def test_cli_without_the_data_file_says_how_to_get_it(checkpoint, tmp_path):
    with pytest.raises(SystemExit, match="--download"):
        main(["--checkpoint", str(checkpoint[0]), "--data", str(tmp_path / "missing.jsonl"), "--device", "cpu"])
