"""Hugging Face export: the exported GPT2LMHeadModel computes our logits, its tokenizer encodes as tiktoken, both
load offline, and what cannot be exported says so in one line."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data.tokenizer import gpt2_encoding
from evaluation.export_hf import save_hf
from evaluation.hellaswag import load_model
from model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[2]
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
TEXTS = ["Hello world", "  two  spaces,\ttabs\n\nand lines", "naïve café — 東京 🙂", "It's 2026; we're done.",
         "<|endoftext|>after the end", "x" * 40]


def our_logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(idx)[0]


def hf_logits(out: Path, idx: torch.Tensor, attention: str = "eager") -> torch.Tensor:
    exported = AutoModelForCausalLM.from_pretrained(out, attn_implementation=attention, dtype=torch.float32).eval()
    with torch.no_grad():
        return exported(idx).logits


@pytest.mark.parametrize("options", [
    dict(bias=False, scale_attn_by_inverse_layer_idx=False, activation="gelu"),
    dict(bias=True, scale_attn_by_inverse_layer_idx=False, activation="gelu"),
    dict(bias=False, scale_attn_by_inverse_layer_idx=True, activation="gelu_tanh"),
    dict(bias=True, scale_attn_by_inverse_layer_idx=True, activation="gelu_tanh", vocab_size=50257),
])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_exported_model_computes_our_logits_for_every_option(tmp_path, options, attention):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, block_size=24, **options)).eval()
    with torch.no_grad():  # biases and layer-norm gains away from their initial 0 and 1, so that they count
        for name, param in model.named_parameters():
            if name.endswith((".bias", "ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.add_(0.1 * torch.randn_like(param))
    idx = torch.randint(0, 50257, (2, 24))
    out = save_hf(model, tmp_path / "hf")
    torch.testing.assert_close(hf_logits(out, idx, attention), our_logits(model, idx), atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """A run of train.py (tanh GELU, inverse-layer scaling, no biases), exported by the command."""
    run_dir, out = tmp_path_factory.mktemp("run"), tmp_path_factory.mktemp("hf")
    subprocess.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", "model.n_layer=2", "model.n_head=2",
                    "model.n_embd=32", "model.activation=gelu_tanh", "model.scale_attn_by_inverse_layer_idx=true",
                    "train.batch_size=2", "train.block_size=32", "train.max_iters=4", "train.eval_interval=4",
                    "train.checkpoint_interval=4", "train.device=cpu", "train.warmup_iters=1"],
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    result = subprocess.run([sys.executable, "-m", "evaluation.export_hf", "--checkpoint", str(run_dir), "--out",
                             str(out)], cwd=REPO, env=OFFLINE, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return run_dir, out


def test_an_exported_training_checkpoint_gives_our_logits_on_real_text(exported_run):
    run_dir, out = exported_run
    model, _ = load_model(run_dir, torch.device("cpu"))
    idx = torch.tensor([gpt2_encoding().encode("ROMEO: But soft, what light through yonder window breaks?")])
    torch.testing.assert_close(hf_logits(out, idx), our_logits(model.eval(), idx), atol=1e-5, rtol=1e-5)


def test_the_exported_tokenizer_loads_offline_and_encodes_as_tiktoken(exported_run):
    _, out = exported_run
    tokenizer = AutoTokenizer.from_pretrained(out)
    encoding = gpt2_encoding()
    for text in TEXTS:
        ids = encoding.encode(text, allowed_special="all")
        assert tokenizer(text)["input_ids"] == ids, text
        assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token_id == 50256


def test_a_file_that_is_not_a_checkpoint_is_one_line_of_error(tmp_path):
    bogus = tmp_path / "ckpt_00000001.pt"
    bogus.write_text("not a checkpoint")
    for checkpoint in (bogus, tmp_path / "missing", tmp_path / "empty-run"):
        if checkpoint.name == "empty-run":
            checkpoint.mkdir()
        result = subprocess.run([sys.executable, "-m", "evaluation.export_hf", "--checkpoint", str(checkpoint),
                                 "--out", str(tmp_path / "out")], cwd=REPO, env=OFFLINE, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("error:") and str(checkpoint) in result.stderr
