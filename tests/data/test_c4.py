"""C4 as GaLore reads it (data/c4.py): its preparation from a local copy in the Hub's layout, the rows the loader
serves, the tokens the loss scores, and the whole-split evaluation. No network: the copy and a tokenizer shaped as
t5-base are made here (tests/data/c4_layout.py)."""
import math
import sys

import numpy as np
import pytest
import torch

from configs.schema import EvalSampling
from data import c4
from data import prepare as prepare_module
from data.loader import TokenBatches, load_split
from data.prepare import main as prepare_main
from data.shards import corpus_tokenizer, read_manifest, read_shard
from model import Llama, LlamaConfig
from model.loss import IGNORED_TARGET
from tests.data.c4_layout import c4_copy, c4_documents, t5_like_tokenizer
from training.distributed import DistributedContext
from training.metrics import read_metrics
from training.validation import evaluation_record, validation_losses, whole_split_loss

VAL_TOKENS, TRAIN_DOCUMENTS, SHARD_ROWS = 2_500, 300, 64
PAD = 0


@pytest.fixture(scope="module")
def c4_inputs(tmp_path_factory):
    """(local C4 copy, tokenizer directory, its documents by split in file order)."""
    root = tmp_path_factory.mktemp("c4")
    documents = c4_documents(420)
    train, validation = documents[:340], documents[340:]
    copy = c4_copy(root / "copy", train, validation)
    tokenizer = t5_like_tokenizer(root / "tokenizer", documents)
    return copy, tokenizer, {"train": train, "validation": validation}


def prepare_args(c4_inputs, out, *extra):
    copy, tokenizer, _ = c4_inputs
    return ["c4", "--from", str(copy), "--tokenizer", str(tokenizer), "--out", str(out), "--val-tokens",
            str(VAL_TOKENS), "--train-documents", str(TRAIN_DOCUMENTS), "--shard-size", str(SHARD_ROWS * 256),
            *extra]


@pytest.fixture(scope="module")
def prepared(c4_inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("prepared") / "c4"
    prepare_main(prepare_args(c4_inputs, out))
    return out


def split_rows(directory, split) -> np.ndarray:
    manifest = read_manifest(directory)
    shards = [read_shard(directory / s["file"]) for s in manifest["shards"] if s["split"] == split]
    return np.concatenate(shards).reshape(-1, 256)


def galores_rows(c4_inputs, split: str, count: int) -> np.ndarray:
    """The first ``count`` rows of ``split`` by GaLore's own calls (torchrun_main.py:86-87, 170-172, 183-192;
    peft_pretraining/dataloader.py:28-34): the streamed split shuffled with seed 42, each document tokenized alone."""
    import datasets
    from transformers import AutoTokenizer

    copy, tokenizer_dir, _ = c4_inputs
    files = sorted(str(p) for p in (copy / "en").glob(f"c4-{split}.*.json.gz"))
    stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True).shuffle(seed=42)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), model_max_length=256)
    rows = []
    for example in stream.take(count):
        rows.append(tokenizer(example["text"], max_length=256, truncation=True, padding="max_length",
                              return_tensors="pt")["input_ids"].squeeze(0).numpy())
    return np.stack(rows)


def test_each_document_is_its_row_as_galores_trainer_tokenizes_it_in_their_shuffled_order(c4_inputs, prepared):
    val, train = split_rows(prepared, "val"), split_rows(prepared, "train")
    assert np.array_equal(val, galores_rows(c4_inputs, "validation", len(val)))
    assert np.array_equal(train, galores_rows(c4_inputs, "train", TRAIN_DOCUMENTS))
    assert len(train) == TRAIN_DOCUMENTS
    # the shuffle is real: the rows are not the documents in the files' order
    _, tokenizer_dir, documents = c4_inputs
    tokenizer = c4.load_tokenizer(str(tokenizer_dir))
    assert not np.array_equal(val, c4.tokenize_rows(tokenizer, documents["validation"][:len(val)]))
    # every row ends its text with </s> and pads after it; a long document is cut to 255 tokens and </s>
    text_lengths = (val != PAD).sum(axis=1)
    assert all(row[n - 1] == 1 and not row[n:].any() for row, n in zip(val, text_lengths))
    assert (text_lengths == 256).any() and (text_lengths < 64).any()


def test_validation_takes_documents_until_their_text_tokens_pass_the_budget(prepared):
    # GaLore checks its count before each evaluation batch (torchrun_main.py:107): a document at a time here
    text_tokens = (split_rows(prepared, "val") != PAD).sum(axis=1)
    assert text_tokens.sum() > VAL_TOKENS >= text_tokens[:-1].sum()
    manifest = read_manifest(prepared)
    assert manifest["text_tokens"] == {"val": int(text_tokens.sum()),
                                       "train": int((split_rows(prepared, "train") != PAD).sum())}


def test_the_manifest_records_the_tokenizer_and_the_rows(c4_inputs, prepared):
    manifest = read_manifest(prepared)
    _, tokenizer_dir, _ = c4_inputs
    tokenizer = c4.load_tokenizer(str(tokenizer_dir))
    assert manifest["tokenizer"] == str(tokenizer_dir) and manifest["vocab_size"] == len(tokenizer)
    assert manifest["tokenizer_fingerprint"] == c4.tokenizer_fingerprint(tokenizer)
    assert manifest["rows"] == {"tokens": 256, "pad_token": PAD} and manifest["eot_token"] == 1
    assert manifest["split"]["rule"] == "galore" and manifest["split"]["seed"] == 42
    assert manifest["complete"] and manifest["source"]["hub"] == "allenai/c4"


def test_a_tokenizer_directory_given_relative_is_recorded_by_its_absolute_path(c4_inputs, tmp_path, monkeypatch):
    # the manifest's name is repeated by what refuses or exports the corpus's models, from other directories
    _, tokenizer_dir, _ = c4_inputs
    monkeypatch.chdir(tokenizer_dir.parent)
    prepare_main(prepare_args(c4_inputs, tmp_path / "c4", "--tokenizer", tokenizer_dir.name, "--train-documents",
                              "20"))
    assert read_manifest(tmp_path / "c4")["tokenizer"] == str(tokenizer_dir.resolve())


def test_a_rerun_with_another_tokenizer_of_the_same_name_is_refused_in_one_line(c4_inputs, tmp_path):
    _, _, documents = c4_inputs
    tokenizer = tmp_path / "tokenizer"
    t5_like_tokenizer(tokenizer, documents["train"], vocab_size=300)
    args = prepare_args(c4_inputs, tmp_path / "c4", "--tokenizer", str(tokenizer), "--train-documents", "70")
    prepare_main(args)  # the later --tokenizer and --train-documents are argparse's
    t5_like_tokenizer(tokenizer, documents["train"], vocab_size=350)  # the same path, another vocabulary
    with pytest.raises(SystemExit) as refused:
        prepare_main(args)
    message = str(refused.value)
    assert message.startswith("error: ") and "\n" not in message
    assert "prepared with different vocab_size, tokenizer_fingerprint" in message and "--overwrite" in message


def test_an_interrupted_preparation_resumes_to_the_uninterrupted_ones_shards(c4_inputs, prepared, tmp_path,
                                                                             monkeypatch):
    out, written = tmp_path / "c4", []
    real_write = prepare_module.write_shard

    def write_then_stop(path, tokens):
        if len(written) == 3:  # the val shard and two train shards are finished
            raise KeyboardInterrupt
        real_write(path, tokens)
        written.append(path.name)

    monkeypatch.setattr(prepare_module, "write_shard", write_then_stop)
    with pytest.raises(KeyboardInterrupt):
        prepare_main(prepare_args(c4_inputs, out))
    assert not read_manifest(out)["complete"] and len(read_manifest(out)["shards"]) == 3
    monkeypatch.setattr(prepare_module, "write_shard", real_write)
    prepare_main(prepare_args(c4_inputs, out))
    resumed, uninterrupted = read_manifest(out), read_manifest(prepared)
    assert {k: v for k, v in resumed.items() if k != "command"} == {
        k: v for k, v in uninterrupted.items() if k != "command"}
    for shard in uninterrupted["shards"]:
        assert (out / shard["file"]).read_bytes() == (prepared / shard["file"]).read_bytes()


@pytest.mark.parametrize("extra, message", [
    (["--split", "llm.c"], "--split does not apply to c4"),
    (["--workers", "2", "--test-size", "0.1"], "--test-size and --workers do not apply to c4"),
    (["--shard-size", "1000"], "--shard-size must hold whole rows of 256 tokens, got 1000"),
    (["--train-documents", "0"], "--train-documents and --val-tokens must be positive"),
])
def test_what_does_not_apply_to_c4_is_refused_in_one_line(c4_inputs, tmp_path, extra, message):
    with pytest.raises(SystemExit) as refused:
        prepare_main(prepare_args(c4_inputs, tmp_path / "c4", *extra))
    assert str(refused.value) == f"error: {message}" or (message in str(refused.value)
                                                        and "\n" not in str(refused.value))


def test_a_copy_without_c4s_files_and_a_tokenizer_that_cannot_load_are_refused_in_one_line(c4_inputs, tmp_path):
    copy, tokenizer_dir, _ = c4_inputs
    with pytest.raises(SystemExit, match=r"holds no C4 validation files .*give --from the directory of a copy"):
        prepare_main(["c4", "--from", str(tmp_path), "--tokenizer", str(tokenizer_dir), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match=r"cannot load the tokenizer .*give --tokenizer the directory of a saved"):
        prepare_main(["c4", "--from", str(copy), "--tokenizer", str(tmp_path / "none"), "--out", str(tmp_path / "o")])


def row_batches(directory, split="val", **args) -> TokenBatches:
    tokens = load_split(directory, split, vocab_size=400)
    return TokenBatches(tokens, split, **{"batch_size": 4, "block_size": 256, "seed": 0, **args})


def test_a_row_is_its_input_and_its_next_tokens_its_targets_the_paddings_ignored(prepared):
    batches = row_batches(prepared, sampling="sequential")
    rows = split_rows(prepared, "val").astype(np.int64)
    x, y = batches.batch(step=1)
    assert torch.equal(x, torch.from_numpy(rows[4:8]))
    expected = np.where(rows[4:8, 1:] == PAD, IGNORED_TARGET, rows[4:8, 1:])
    assert torch.equal(y[:, :-1], torch.from_numpy(expected)) and (y[:, -1] == IGNORED_TARGET).all()
    assert batches.windows_per_epoch == len(rows)


@pytest.mark.parametrize("sampling", ["random", "random_shard"])
def test_random_draws_start_at_whole_rows(prepared, sampling):
    batches = row_batches(prepared, "train", sampling=sampling)
    starts = np.concatenate([batches.window_starts(step) for step in range(50)])
    assert (starts % 256 == 0).all() and len(np.unique(starts)) > 50
    assert starts.max() <= (TRAIN_DOCUMENTS - 1) * 256


def test_sequential_rows_are_read_once_in_order_and_disjoint_across_ranks(prepared):
    ranks = [row_batches(prepared, "train", sampling="sequential", grad_accum_steps=2, rank=r, world_size=2)
             for r in range(2)]
    starts = [s for step in range(3) for micro in range(2) for b in ranks for s in b.window_starts(step, micro)]
    assert starts == [256 * k for k in range(3 * 2 * 2 * 4)]


def test_a_block_size_other_than_the_rows_is_refused_in_one_line(prepared):
    with pytest.raises(ValueError, match=r"holds each document as its own row of 256 tokens \(padded\): set "
                                         r"train\.block_size=256, not 128$"):
        row_batches(prepared, block_size=128)


def tiny_llama(vocab_size=400) -> Llama:
    torch.manual_seed(0)
    return Llama(LlamaConfig(n_layer=2, n_head=2, n_embd=32, intermediate_size=64, vocab_size=vocab_size,
                             block_size=256))


def test_the_scored_tokens_and_their_loss_are_a_llama_causal_lms_with_galores_labels(prepared):
    # GaLore: labels = input_ids with the padding set to -100, the loss the model's own shifted mean
    # (torchrun_main.py:411-415); the same model as transformers' LlamaForCausalLM (tests/model/test_llama.py).
    from evaluation.export_hf import hf_llama_model

    model = tiny_llama()
    hf = hf_llama_model(model).eval()
    x, y = row_batches(prepared, sampling="sequential").batch(step=0)
    labels = x.clone()
    labels[labels == PAD] = -100
    with torch.no_grad():
        theirs = hf(input_ids=x, attention_mask=(x != PAD).long(), labels=labels).loss
        _, ours = model(x, y)
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=0)


def test_the_whole_evaluation_is_the_mean_over_every_scored_target_of_the_split(prepared):
    model = tiny_llama()
    rows = torch.from_numpy(split_rows(prepared, "val").astype(np.int64))
    with torch.no_grad():
        logits, _ = model(rows)
    targets = torch.cat([rows[:, 1:], torch.full((len(rows), 1), PAD)], dim=1)
    targets[targets == PAD] = IGNORED_TARGET
    expected = torch.nn.functional.cross_entropy(logits.double().flatten(0, 1), targets.flatten()).item()
    ctx = DistributedContext()
    batches = row_batches(prepared, batch_size=4, sampling="sequential")  # 4 does not divide the rows: a short last
    assert len(rows) % 4
    loss = whole_split_loss(model, batches, torch.autocast("cpu", enabled=False), ctx)
    assert math.isclose(loss, expected, rel_tol=1e-6)
    metrics = validation_losses(model, batches, batches, 1, EvalSampling.whole, 0,
                                torch.autocast("cpu", enabled=False), ctx)
    assert metrics == {"val/loss": loss, "val/perplexity": math.exp(loss)}
    assert evaluation_record(EvalSampling.whole, 8, batches) == {
        "sampling": "whole", "batches": math.ceil(len(rows) / 4), "windows": len(rows)}


def train_on_c4(run_dir, prepared, ranks=1, *overrides):
    from tests import warm_python
    from tests.test_train import REPO

    command = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", "model=llama-tiny", "model.n_layer=1",
               "model.vocab_size=400", "data=c4", f"data.dir={prepared}", "train.block_size=256",
               "train.eval_sampling=whole", "train.batch_size=2", "train.global_batch_size=4", "train.max_iters=4",
               "train.eval_interval=2", "train.warmup_iters=1", "train.log_interval=1", "train.device=cpu",
               *overrides]
    results = (warm_python.run_ranks(command, world_size=ranks, cwd=REPO, timeout=600) if ranks > 1 else
               [warm_python.run(command, cwd=REPO, timeout=600)])
    for result in results:
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return read_metrics(run_dir)


@pytest.mark.slow
def test_a_llama_run_on_c4_logs_its_perplexity_and_two_ranks_score_and_train_as_one_process(prepared, tmp_path):
    one = train_on_c4(tmp_path / "one", prepared)
    two = train_on_c4(tmp_path / "two", prepared, 2)
    evaluations = [r for r in one if "val/loss" in r]
    assert [r["step"] for r in evaluations] == [0, 2, 4]
    assert all(r["val/perplexity"] == math.exp(r["val/loss"]) for r in evaluations)
    assert evaluations[-1]["val/loss"] < evaluations[0]["val/loss"]
    launch = next(r for r in one if "evaluation" in r)
    assert launch["evaluation"] == {"sampling": "whole", "batches": math.ceil(15 / 2), "windows": 15}
    # the same rows, in the same order, make each step on one process and on two ranks
    for key in ("train/loss", "val/loss"):
        assert [r[key] for r in one if key in r] == pytest.approx([r[key] for r in two if key in r], rel=1e-5)
    # make_table gives the run's perplexity at its best evaluation after step 0 (no literature figure: 4 steps)
    from reporting.run_selection import load_runs
    from scripts.make_table import make_table
    from tests.scripts.test_make_table import table_rows

    rows = table_rows(make_table(load_runs([str(tmp_path / "one")])), "### C4: validation perplexity")
    best = min(r["val/loss"] for r in evaluations if r["step"] > 0)
    assert list(rows.values())[-1] == [f"{math.exp(best):.2f}"]
    # its tokens are t5-base's: what encodes text with GPT-2's tokenizer refuses it in one line
    from evaluation.sample import sample

    with pytest.raises(ValueError, match=r"was trained on the tokens of .*tokenizer; sampling encodes text with "
                                         r"GPT-2's tokenizer"):
        sample(tmp_path / "one", "To be", max_new_tokens=2, temperature=1.0, top_k=None, seed=0)
    # what refuses it reads the checkpoint's record of the corpus's tokenizer (c4_checkpoint's, below)
    from training.checkpoint import latest_checkpoint

    _, state = latest_checkpoint(tmp_path / "one", torch.device("cpu"))
    assert state["tokenizer"] == corpus_tokenizer(read_manifest(prepared))


def test_a_batch_of_one_row_keeps_its_padding_in_the_input(prepared):
    # a one-row slice of the windows is contiguous: the targets' masking must not reach the input's memory
    padded_row = int(np.argmax((split_rows(prepared, "val") == PAD).any(axis=1)))
    x, y = row_batches(prepared, batch_size=1, sampling="sequential").batch(step=padded_row)
    assert (x >= 0).all() and (x == PAD).any() and (y == IGNORED_TARGET).any()


# What evaluates or exports a model of the corpus's tokens: the checkpoint records them (the slow run above
# checks train.py writes this record), whatever data's name.


def c4_checkpoint(prepared, path, data_name="custom", recorded=True):
    """A checkpoint file as train.py writes one of a model trained on the prepared corpus: weights, config and
    (``recorded``) the corpus's tokenizer."""
    model = tiny_llama()
    state = {"model": model.state_dict(), "config": {"model": {"arch": "llama", **vars(model.config)},
                                                     "data": {"name": data_name, "dir": str(prepared)}}}
    if recorded:
        state["tokenizer"] = corpus_tokenizer(read_manifest(prepared))
    torch.save(state, path)
    return model, path


@pytest.mark.parametrize("data_name, recorded, refused", [
    ("custom", True, True),  # a corpus of t5-like tokens by data.dir: its record tells
    ("c4", True, True),
    ("c4", False, True),  # a checkpoint from before the record: data=c4 is t5-base's
    ("custom", False, False)])  # ... and any other corpus GPT-2's
def test_what_encodes_text_with_gpt2s_tokenizer_refuses_a_model_of_other_tokens(prepared, tmp_path, data_name,
                                                                               recorded, refused):
    from evaluation.checkpoints import load_model

    _, checkpoint = c4_checkpoint(prepared, tmp_path / "ckpt.pt", data_name, recorded)
    if not refused:
        load_model(checkpoint, gpt2_text_for="HellaSwag")
        return
    name = str(c4_inputs_tokenizer(prepared)) if recorded else "t5-base"
    with pytest.raises(ValueError, match=rf"^{checkpoint} was trained on the tokens of {name}; HellaSwag encodes "
                                         r"text with GPT-2's tokenizer, which that model cannot read: compare it by "
                                         r"its validation perplexity \(docs/c4\.md\)$"):
        load_model(checkpoint, gpt2_text_for="HellaSwag")
    load_model(checkpoint)  # what reads no text takes it


def c4_inputs_tokenizer(prepared) -> str:
    return read_manifest(prepared)["tokenizer"]


def test_the_export_of_a_c4_model_ships_the_corpus_tokenizer_and_its_special_ids(c4_inputs, prepared, tmp_path):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from evaluation.export_hf import main as export_main

    _, tokenizer_dir, documents = c4_inputs
    model, checkpoint = c4_checkpoint(prepared, tmp_path / "ckpt.pt")
    export_main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "hf"), "--tokenizer", str(tokenizer_dir)])
    shipped, source = AutoTokenizer.from_pretrained(tmp_path / "hf"), AutoTokenizer.from_pretrained(tokenizer_dir)
    texts = documents["validation"][:20]
    assert shipped(texts)["input_ids"] == source(texts)["input_ids"]
    assert c4.tokenizer_fingerprint(shipped) == read_manifest(prepared)["tokenizer_fingerprint"]
    exported = LlamaForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert (exported.config.bos_token_id, exported.config.eos_token_id, exported.config.pad_token_id) == (
        None, source.eos_token_id, PAD)
    x, _ = row_batches(prepared, sampling="sequential").batch(step=0)
    with torch.no_grad():
        assert torch.allclose(exported(input_ids=x).logits, model.eval()(x)[0], rtol=0, atol=1e-5)


def test_the_export_of_a_c4_model_without_its_tokenizer_or_with_another_is_refused_in_one_line(c4_inputs, prepared,
                                                                                              tmp_path):
    from evaluation.export_hf import main as export_main

    _, tokenizer_dir, documents = c4_inputs
    _, checkpoint = c4_checkpoint(prepared, tmp_path / "ckpt.pt")
    other = t5_like_tokenizer(tmp_path / "other", documents["train"][:60], vocab_size=300)
    name = c4_inputs_tokenizer(prepared)
    args = ["--checkpoint", str(checkpoint), "--out", str(tmp_path / "hf")]
    with pytest.raises(SystemExit, match=rf"^error: {checkpoint} was trained on the tokens of {name}, not GPT-2's: "
                                         rf"pass --tokenizer {name} \(or a saved copy's directory\) for the export "
                                         r"to ship it$"):
        export_main(args)
    with pytest.raises(SystemExit, match=rf"^error: --tokenizer {other} is not the one {checkpoint}'s corpus was "
                                         r"prepared with \(its vocabulary's fingerprint is \w+, the corpus's \w+\): "
                                         rf"pass that one, {name}$"):
        export_main([*args, "--tokenizer", str(other)])
    gpt2_checkpoint = tmp_path / "gpt2.pt"
    torch.save({"model": tiny_llama(50304).state_dict(), "config": {"model": {"arch": "llama", **vars(
        tiny_llama(50304).config)}}}, gpt2_checkpoint)
    with pytest.raises(SystemExit, match=rf"^error: {gpt2_checkpoint} was trained on GPT-2's tokens, whose tokenizer "
                                         rf"the export builds itself: drop --tokenizer {tokenizer_dir}$"):
        export_main(["--checkpoint", str(gpt2_checkpoint), "--out", str(tmp_path / "hf"), "--tokenizer",
                     str(tokenizer_dir)])
    assert not (tmp_path / "hf").exists()


def test_hellaswag_during_a_run_on_a_corpus_of_other_tokens_is_refused_in_one_line(prepared, tmp_path):
    # data=c4 is refused when the config is composed (tests/configs/test_c4_presets.py); by data.dir, here
    from tests import warm_python
    from tests.test_train import REPO

    result = warm_python.run([sys.executable, "train.py", f"hydra.run.dir={tmp_path / 'run'}", "model=llama-tiny",
                              "model.vocab_size=400", "data=custom", f"data.dir={prepared}", "train.block_size=256",
                              "train.device=cpu", "train.hellaswag_interval=10"], cwd=REPO, timeout=600)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: train.hellaswag_interval: HellaSwag is scored in GPT-2's tokens, and those of {prepared} are "
        f"{c4_inputs_tokenizer(prepared)}'s: set train.hellaswag_interval=0")
