"""Sampling: deterministic with a seed, greedy at temperature 0, top-k, never a padding token; the CLI on a
checkpoint written by train.py."""
import sys
from pathlib import Path

import pytest
import torch

from data.tokenizer import GPT2_VOCAB_SIZE
from evaluation.sample import generate, main
from model import ARCHITECTURES
from tests import tiny_models, warm_python

REPO = Path(__file__).resolve().parents[2]


def tiny_model(vocab_size=50304, block_size=16, arch="gpt2"):
    return tiny_models.tiny_model(arch, block_size=block_size, vocab_size=vocab_size).eval()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_same_seed_gives_the_same_tokens_and_another_seed_other_ones(arch):
    model, idx = tiny_model(arch=arch), torch.tensor([[464, 3290]])
    draw = lambda seed: generate(model, idx, 12, temperature=1.0, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_temperature_zero_and_top_k_one_take_the_most_likely_token_each_step(arch):
    model, idx = tiny_model(arch=arch), torch.tensor([[464, 3290, 318]])
    expected = idx
    for _ in range(6):
        logits, _ = model(expected)
        expected = torch.cat((expected, logits[:, -1, :GPT2_VOCAB_SIZE].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(generate(model, idx, 6, temperature=0), expected)
    assert torch.equal(generate(model, idx, 6, temperature=1.0, top_k=1, generator=torch.Generator()), expected)


def test_top_k_draws_only_among_the_k_most_likely_tokens():
    model, idx = tiny_model(), torch.tensor([[464]])
    allowed = set(torch.topk(model(idx)[0][0, -1, :GPT2_VOCAB_SIZE], 5).indices.tolist())
    firsts = {generate(model, idx, 1, temperature=2.0, top_k=5,
                       generator=torch.Generator().manual_seed(seed))[0, 1].item() for seed in range(40)}
    assert firsts <= allowed and len(firsts) > 1


def test_the_rows_that_pad_the_vocabulary_are_never_sampled():
    model = tiny_model()
    with torch.no_grad():
        model.lm_head.weight[:GPT2_VOCAB_SIZE] = 0.0  # every real token at logit 0,
        model.lm_head.weight[GPT2_VOCAB_SIZE:] *= 1000.0  # the largest padding row far above: it would win
    out = generate(model, torch.tensor([[464]]), 8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert out.max().item() < GPT2_VOCAB_SIZE
    assert model(torch.tensor([[464]]))[0][0, -1].argmax().item() >= GPT2_VOCAB_SIZE  # the rows did dominate


def test_a_prompt_longer_than_the_context_is_cropped_to_its_last_block():
    model = tiny_model(block_size=8)
    out = generate(model, torch.arange(20).unsqueeze(0), 3, temperature=0)
    assert torch.equal(out[:, :20], torch.arange(20).unsqueeze(0))
    assert torch.equal(out[:, 20:], generate(model, torch.arange(12, 20).unsqueeze(0), 3, temperature=0)[:, 8:])


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    warm_python.run([sys.executable, "train.py", f"hydra.run.dir={run_dir}", "model.n_layer=1", "model.n_head=2",
                     "model.n_embd=32", "train.batch_size=2", "train.block_size=32", "train.max_iters=2",
                     "train.eval_interval=2", "train.checkpoint_interval=2", "train.device=cpu"],
                    cwd=REPO, check=True, timeout=600)
    return run_dir


@pytest.mark.slow
def test_the_command_prints_the_prompt_and_its_continuation_the_same_for_the_same_seed(trained_run, capsys):
    args = ["--checkpoint", str(trained_run), "--prompt", "ROMEO:", "--max-new-tokens", "10", "--seed", "7",
            "--num-samples", "2", "--device", "cpu"]
    main(args)
    first = capsys.readouterr().out
    main(args)
    assert capsys.readouterr().out == first
    samples = first.rstrip("\n").split("\n---------------\n")
    assert len(samples) == 2 and all(text.startswith("ROMEO:") and len(text) > len("ROMEO:") for text in samples)


@pytest.mark.slow
def test_a_directory_without_checkpoints_is_one_line_of_error(tmp_path):
    result = warm_python.run([sys.executable, "-m", "evaluation.sample", "--checkpoint", str(tmp_path)], cwd=REPO,
                             timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error:") and "holds no checkpoint" in result.stderr


@pytest.mark.parametrize("directory", ["", "a_long_directory_name/" * 12])
def test_a_safetensors_file_is_named_as_no_training_checkpoint_not_as_a_torn_one(tmp_path, directory):
    from safetensors.torch import save_file

    weights = tmp_path / directory / "model.safetensors"  # a long path must not cut the advice off the message
    weights.parent.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.clone() for name, tensor in tiny_model().state_dict().items()}, weights)
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(weights), "--device", "cpu"])
    message = exit_info.value.code
    assert message.startswith(f"error: {weights} is not a checkpoint written by train.py") and "\n" not in message
    assert "safetensors" in message and "ckpt_*.pt" in message and "torn" not in message
