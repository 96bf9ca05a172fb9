"""Export to Hugging Face format: the exported GPT2LMHeadModel computes our logits, the tokenizer tiktoken's ids."""
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: nothing here may download

import pytest
import torch
from tiktoken.load import load_tiktoken_bpe

from data.embedded import clean_play, play_files
from data.tokenizer import GPT2_EOT_TOKEN, GPT2_RANKS_FILE, gpt2_encoding
from evaluation.checkpoints import model_from_state
from model import GPT, GPTConfig, Llama, LlamaConfig, build_model, model_config
from model.gpt import ACTIVATIONS
from training.checkpoint import load_checkpoint
from training.metrics import read_metrics
from tests import warm_python

REPO = Path(__file__).resolve().parents[2]
# Every option the export maps, on 2 layers (so that scale_attn_by_inverse_layer_idx divides by 1 and by 2).
CONFIGS = {
    "no-bias, layer-scaled, tanh GELU": dict(bias=False, scale_attn_by_inverse_layer_idx=True,
                                             activation="gelu_tanh"),
    "bias, exact GELU": dict(bias=True, scale_attn_by_inverse_layer_idx=False, activation="gelu"),
    "bias, layer-scaled, tanh GELU, unpadded vocabulary": dict(
        bias=True, scale_attn_by_inverse_layer_idx=True, activation="gelu_tanh", vocab_size=50257),
    "no-bias, exact GELU": dict(bias=False, scale_attn_by_inverse_layer_idx=False, activation="gelu"),
}
TEXTS = [
    "Hello world",
    " leading space, trailing space ",
    "whitespace   runs\t\tand\n\n\nnewlines  \n  \r\n",
    "naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어, emoji 🤖🎉 and combining e\u0301",
    "It's we'll they've I'D 12345678 3.14159 $$$ ... ---",
    "one document<|endoftext|>the next",
    "<|endoftext|>",
]


# Imported by the tests that use them, not at collection: transformers takes seconds to import, which every pytest
# worker would pay whether or not it runs these tests.
def export_hf():
    return importlib.import_module("evaluation.export_hf")


def transformers():
    return importlib.import_module("transformers")


def offline_env() -> dict[str, str]:
    """This process's environment (the session's data cache included) with the Hugging Face hub offline."""
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def hf_causal_lm(directory: Path, attn_implementation: str = "sdpa"):
    return transformers().AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                                attn_implementation=attn_implementation).eval()


def perturbed_gpt(config: GPTConfig, seed: int = 0) -> GPT:
    """A GPT whose every parameter is random: biases and layer norms too, so a misplaced one changes the logits."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model


@pytest.fixture(scope="module", params=list(CONFIGS), ids=list(CONFIGS))
def exported_random_model(request, tmp_path_factory):
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, **CONFIGS[request.param])
    model = perturbed_gpt(config)
    return model, export_hf().save_hf(model, tmp_path_factory.mktemp("export") / "hf")


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_exported_model_computes_our_logits_at_every_position(exported_random_model, attn_implementation):
    model, directory = exported_random_model
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.config.vocab_size, (2, model.config.block_size), generator=generator)
    with torch.no_grad():
        ours, _ = model(tokens)
        theirs = hf_causal_lm(directory, attn_implementation)(tokens).logits
    assert ours.shape == theirs.shape == (2, model.config.block_size, model.config.vocab_size)
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


def test_every_exported_file_is_readable_as_the_umask_allows_the_weights_too(exported_random_model):
    _, directory = exported_random_model
    umask = os.umask(0)
    os.umask(umask)
    modes = {path.name: oct(path.stat().st_mode & 0o777) for path in directory.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {oct(0o666 & ~umask)}, modes


@pytest.mark.parametrize("documented", ["docs/evaluation.md", "evaluation/export_hf.py"])
def test_the_documented_export_writes_where_git_ignores_it_so_later_launches_record_no_untracked_files(documented):
    example = next(line for line in (REPO / documented).read_text().splitlines() if "evaluation.export_hf --" in line)
    out = example.split("--out ", 1)[1].split()[0]
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", f"{out}/model.safetensors"],
                             capture_output=True, text=True)
    assert ignored.returncode == 0, f"{out} is not ignored by git: {ignored.stderr}"


def test_exported_model_is_tied_float32_and_keeps_the_padded_vocabulary(exported_random_model):
    model, directory = exported_random_model
    exported = hf_causal_lm(directory)
    assert exported.lm_head.weight.data_ptr() == exported.transformer.wte.weight.data_ptr()
    assert exported.transformer.wte.weight.dtype == torch.float32
    torch.testing.assert_close(exported.transformer.wte.weight, model.transformer.wte.weight, atol=0, rtol=0)
    assert exported.config.vocab_size == model.config.vocab_size
    assert exported.config.n_positions == model.config.block_size


def test_config_carries_every_option_of_ours():
    hf_config = export_hf().hf_config
    config = hf_config(GPTConfig(n_layer=3, n_head=4, n_embd=64, block_size=48, vocab_size=50304, dropout=0.125,
                                 scale_attn_by_inverse_layer_idx=True, activation="gelu_tanh"))
    shape = (config.n_layer, config.n_head, config.n_embd, config.n_positions, config.vocab_size)
    assert shape == (3, 4, 64, 48, 50304)
    assert config.n_inner is None  # HF's 4 x n_embd, as our MLP
    assert (config.embd_pdrop, config.attn_pdrop, config.resid_pdrop) == (0.125, 0.125, 0.125)
    assert config.scale_attn_weights and config.scale_attn_by_inverse_layer_idx
    assert not config.reorder_and_upcast_attn
    assert config.activation_function == "gelu_pytorch_tanh"
    assert config.layer_norm_epsilon == export_hf().LAYER_NORM_EPS
    assert config.tie_word_embeddings
    assert config.bos_token_id == config.eos_token_id == GPT2_EOT_TOKEN
    assert not hf_config(GPTConfig(n_layer=1, n_head=1, n_embd=8)).scale_attn_by_inverse_layer_idx


def test_our_layer_norm_eps_is_the_exported_one():
    layer_norm = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16)).transformer.ln_f
    x = 1e-3 * torch.randn(4, 8)  # variance ~1e-6, where eps decides the output
    reference = torch.nn.functional.layer_norm(x, (8,), layer_norm.weight, None, eps=export_hf().LAYER_NORM_EPS)
    torch.testing.assert_close(layer_norm(x), reference, atol=0, rtol=0)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
def test_every_activation_maps_to_the_very_same_hf_function(activation):
    x = torch.linspace(-12, 12, 100_001)
    ours = torch.nn.GELU(approximate=ACTIVATIONS[activation])(x)
    hf_function = importlib.import_module("transformers.activations").ACT2FN[export_hf().HF_ACTIVATIONS[activation]]
    assert torch.equal(hf_function(x), ours)


def test_an_activation_hf_cannot_express_is_refused(tmp_path):
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16))
    model.config.activation = "relu"  # past GPTConfig's own check: a future option the export does not know
    with pytest.raises(ValueError, match="activation 'relu' has no Hugging Face GPT-2 equivalent"):
        export_hf().save_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A run of train.py itself (the tiny preset: layer-scaled attention, tanh GELU, no biases), 4 steps."""
    run_dir = tmp_path_factory.mktemp("run")
    warm_python.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", "model.n_layer=2", "model.n_head=2",
                     "model.n_embd=32", "train.batch_size=2", "train.block_size=32", "train.max_iters=4",
                     "train.eval_interval=4", "train.eval_iters=1", "train.checkpoint_interval=4",
                     "train.device=cpu", "train.warmup_iters=1"],
                    cwd=REPO, env=offline_env(), check=True, timeout=300)
    return run_dir


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return warm_python.run([sys.executable, "-m", "evaluation.export_hf", *args], cwd=REPO, env=offline_env(),
                           timeout=300)


@pytest.fixture(scope="module")
def exported_run(trained_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported") / "hf"
    result = run_cli("--checkpoint", str(trained_run), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return trained_run, out, json.loads(result.stdout)


@pytest.mark.slow
def test_cli_exports_a_run_directorys_newest_checkpoint(exported_run):
    run_dir, out, printed = exported_run
    assert printed == {"checkpoint": str(run_dir / "checkpoints" / "ckpt_00000004.pt"), "out": str(out)}
    written = {path.name for path in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= written
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"]
    assert config["scale_attn_by_inverse_layer_idx"] and config["activation_function"] == "gelu_pytorch_tanh"
    source = json.loads((out / "training_source.json").read_text())
    [launch] = [r for r in read_metrics(run_dir) if "launch" in r]  # the run's one launch trained it
    assert source == {"checkpoint": str(run_dir.resolve() / "checkpoints" / "ckpt_00000004.pt"), "step": 4,
                      "run_dir": str(run_dir.resolve()), "launches": [{"step": 0, **launch["launch"]}]}


@pytest.mark.slow
def test_exported_run_scores_real_text_as_the_checkpoint_does(exported_run):
    run_dir, out, printed = exported_run
    state = load_checkpoint(Path(printed["checkpoint"]), torch.device("cpu"))
    model = build_model(model_config(state["config"]["model"]))
    model.load_state_dict(state["model"])
    model.eval()
    text = clean_play(next(path for path in play_files() if path.stem == "hamlet").read_text(encoding="utf-8"))
    tokens = transformers().AutoTokenizer.from_pretrained(out)(text[:4000])["input_ids"][: model.config.block_size]
    assert tokens == gpt2_encoding().encode_ordinary(text[:4000])[: model.config.block_size]
    tokens = torch.tensor([tokens])
    exported = hf_causal_lm(out)
    with torch.no_grad():
        ours, our_loss = model(tokens[:, :-1], tokens[:, 1:])
        theirs = exported(tokens, labels=tokens)
    torch.testing.assert_close(theirs.logits[:, :-1], ours, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(theirs.loss, our_loss, atol=1e-5, rtol=1e-5)  # softmax over the padding ids too


@pytest.mark.slow
def test_export_takes_a_checkpoint_file_too(exported_run, tmp_path):
    _, out, printed = exported_run
    assert export_hf().export(Path(printed["checkpoint"]), tmp_path / "hf") == tmp_path / "hf"
    from_file = (tmp_path / "hf" / "model.safetensors").read_bytes()
    assert from_file == (out / "model.safetensors").read_bytes()
    assert (tmp_path / "hf" / "training_source.json").read_text() == (out / "training_source.json").read_text()
    renamed = tmp_path / "best.pt"  # a copy kept by hand: no step in its name, so no launches either
    shutil.copyfile(printed["checkpoint"], renamed)
    source = json.loads((export_hf().export(renamed, tmp_path / "hf-best") / "training_source.json").read_text())
    assert (source["step"], source["launches"]) == (None, [])


@pytest.mark.slow
def test_tokenizer_gives_tiktokens_ids_and_decodes_back(exported_run):
    tokenizer = transformers().AutoTokenizer.from_pretrained(exported_run[1])
    encoding = gpt2_encoding()
    for text in TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids == encoding.encode(text, allowed_special="all"), text
        assert tokenizer.decode(ids) == text
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]  # nothing prepended
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == GPT2_EOT_TOKEN
    assert len(tokenizer) == GPT2_EOT_TOKEN + 1


@pytest.mark.slow
def test_tokenizer_matches_tiktoken_on_a_whole_play(exported_run):
    tokenizer = transformers().AutoTokenizer.from_pretrained(exported_run[1])
    text = clean_play(next(path for path in play_files() if path.stem == "the-tempest").read_text(encoding="utf-8"))
    assert tokenizer(text)["input_ids"] == gpt2_encoding().encode_ordinary(text)


def test_merges_are_gpt2s_in_its_order():
    ranks = load_tiktoken_bpe(str(GPT2_RANKS_FILE))
    merges = export_hf().gpt2_merges(ranks)
    assert len(merges) == 50_000  # GPT-2's merges.txt: one merge per token past the 256 bytes
    assert merges[:4] == [(b" ", b"t"), (b" ", b"a"), (b"h", b"e"), (b"i", b"n")]
    assert all(ranks[left + right] == rank for rank, (left, right) in enumerate(merges, start=256))


@pytest.mark.slow
def test_cli_refuses_a_file_that_is_not_a_checkpoint_in_one_line(tmp_path):
    not_a_checkpoint = tmp_path / "notes.txt"
    not_a_checkpoint.write_text("not a checkpoint\n")
    result = run_cli("--checkpoint", str(not_a_checkpoint), "--out", str(tmp_path / "hf"))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {not_a_checkpoint} is not a checkpoint written by train.py")
    assert not (tmp_path / "hf").exists()


def test_cli_refuses_a_directory_without_checkpoints_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as exit_info:  # a message, not a traceback; Python prints it and exits with 1
        export_hf().main(["--checkpoint", str(tmp_path), "--out", str(tmp_path / "hf")])
    message = exit_info.value.code
    assert isinstance(message, str) and "\n" not in message
    assert message.startswith(f"error: {tmp_path} holds no checkpoint")
    assert not (tmp_path / "hf").exists()


def test_export_says_what_is_wrong_with_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export_hf().export(tmp_path / "missing", tmp_path / "hf")
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(2)}, foreign)
    with pytest.raises(ValueError, match=r"not a checkpoint written by train\.py: it lacks the model's weights"):
        export_hf().export(foreign, tmp_path / "hf")
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=16))
    mismatched = tmp_path / "mismatched.pt"
    torch.save({"model": model.state_dict(), "config": {"model": {"n_layer": 2, "n_head": 1, "n_embd": 8,
                                                                  "block_size": 4, "vocab_size": 16}}}, mismatched)
    with pytest.raises(ValueError, match="its weights do not fit the model of its own config"):
        export_hf().export(mismatched, tmp_path / "hf")
    out_file = tmp_path / "out.txt"
    out_file.write_text("")
    with pytest.raises(ValueError, match="is a file"):
        export_hf().export(small_checkpoint(tmp_path / "good.pt"), out_file)


def test_cli_refuses_an_out_directory_that_holds_files_unless_asked_to_overwrite(tmp_path):
    small_checkpoint(tmp_path / "good.pt")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.md").write_text("my notes\n")
    with pytest.raises(SystemExit) as exit_info:
        export_hf().main(["--checkpoint", str(tmp_path / "good.pt"), "--out", str(out)])
    message = exit_info.value.code
    assert message.startswith(f"error: --out {out} is not empty (it holds notes.md)") and "--overwrite" in message
    assert [path.name for path in out.iterdir()] == ["notes.md"]
    export_hf().main(["--checkpoint", str(tmp_path / "good.pt"), "--out", str(out), "--overwrite"])
    assert (out / "model.safetensors").is_file() and (out / "notes.md").read_text() == "my notes\n"


def small_checkpoint(path: Path) -> Path:
    """A checkpoint file as train.py writes one, of a one-layer GPT: weights and model config."""
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4))  # GPT-2's vocabulary: its token ids fit
    torch.save({"model": model.state_dict(), "config": {"model": vars(model.config)}}, path)
    return path


def test_ctrl_c_during_the_export_is_one_line_and_leaves_no_part_of_it(tmp_path):
    checkpoint = small_checkpoint(tmp_path / "good.pt")
    exports = tmp_path / "exports"
    exports.mkdir()
    process = warm_python.start([sys.executable, "-m", "evaluation.export_hf", "--checkpoint", str(checkpoint),
                                 "--out", str(exports / "hf")], cwd=REPO, env=offline_env(),
                                stdout=tmp_path / "out", stderr=tmp_path / "err")
    deadline = time.monotonic() + 300
    while not any(exports.iterdir()):  # its first directory made: writing, the tokenizer not yet built (~1 s)
        assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    process.wait(timeout=300)
    stderr = (tmp_path / "err").read_text()
    assert process.returncode != 0 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines() == [f"error: interrupted: nothing was written to {exports / 'hf'} (an export "
                                           "appears whole or not at all); run the command again to export"]
    assert list(exports.iterdir()) == []


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_an_exported_llama_is_a_llama_for_causal_lm_that_computes_our_logits(tie, tmp_path):
    torch.manual_seed(0)
    model = Llama(LlamaConfig(n_layer=2, n_head=2, n_embd=32, intermediate_size=40, block_size=32,
                              vocab_size=50304, rope_theta=500.0, tie_embeddings=tie)).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # norm weights away from one, so a misplaced one shows
            parameter.add_(0.05 * torch.randn_like(parameter))
    directory = export_hf().save_hf(model, tmp_path / "hf")
    exported = hf_causal_lm(directory)
    assert type(exported).__name__ == "LlamaForCausalLM"
    assert (exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr()) == tie
    tokens = torch.randint(0, 50304, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(tokens)
        theirs = exported(tokens).logits
    torch.testing.assert_close(theirs, ours)


@pytest.fixture(scope="module")
def exported_llama_run(tmp_path_factory):
    """A 4-step train.py run of llama-tiny in miniature, exported by the command line."""
    run_dir = tmp_path_factory.mktemp("llama_run")
    warm_python.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", "model=llama-tiny", "model.n_layer=2",
                     "model.n_embd=32", "model.intermediate_size=64", "train.batch_size=2", "train.block_size=32",
                     "train.max_iters=4", "train.eval_interval=4", "train.eval_iters=1", "train.checkpoint_interval=4",
                     "train.device=cpu", "train.warmup_iters=1"],
                    cwd=REPO, env=offline_env(), check=True, timeout=300)
    out = tmp_path_factory.mktemp("llama_exported") / "hf"
    result = run_cli("--checkpoint", str(run_dir), "--out", str(out))
    assert result.returncode == 0, result.stderr
    return run_dir, out, json.loads(result.stdout)


@pytest.mark.slow
def test_an_exported_llama_run_scores_real_text_as_the_checkpoint_does(exported_llama_run):
    _, out, printed = exported_llama_run
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    model = model_from_state(load_checkpoint(Path(printed["checkpoint"]), torch.device("cpu")), out)
    assert type(model) is Llama
    text = clean_play(next(path for path in play_files() if path.stem == "hamlet").read_text(encoding="utf-8"))
    tokens = transformers().AutoTokenizer.from_pretrained(out)(text[:4000])["input_ids"][: model.config.block_size]
    assert tokens == gpt2_encoding().encode_ordinary(text[:4000])[: model.config.block_size]
    tokens = torch.tensor([tokens])
    with torch.no_grad():
        ours, our_loss = model(tokens[:, :-1], tokens[:, 1:])
        theirs = hf_causal_lm(out)(tokens, labels=tokens)
    torch.testing.assert_close(theirs.logits[:, :-1], ours)
    torch.testing.assert_close(theirs.loss, our_loss)
