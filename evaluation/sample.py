"""Sample continuations from a checkpoint written by train.py, as nanoGPT's sample.py does.

    python -m evaluation.sample --checkpoint outputs/<run> --prompt "ROMEO:" --max-new-tokens 100 \\
        --temperature 0.8 --top-k 200 --seed 1337 [--num-samples 3] [--device cpu]

The same seed gives the same text on the same device (PyTorch's random streams differ between CPU and CUDA).
Only GPT-2's 50,257 real tokens are drawn: the rows that pad the vocabulary to 50,304 are never sampled.
"""
import contextlib
import math
import sys
from pathlib import Path

import torch

from configs.schema import Precision
from data.tokenizer import GPT2_EOT_TOKEN, GPT2_VOCAB_SIZE, gpt2_encoding
from evaluation.checkpoints import load_model
from reporting import arguments
from training.runtime import autocast_context, resolve_device, resolve_dtype


@torch.no_grad()
def generate(model, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None, autocast=None) -> torch.Tensor:
    """Extend each row of ``idx`` (batch x tokens) by ``max_new_tokens`` sampled tokens.

    ``temperature`` 0 takes the most likely token (greedy); ``top_k`` keeps the k most likely before sampling.
    The context is cropped to the model's last ``block_size`` tokens.
    """
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    block_size = model.config.block_size
    model.eval()
    for _ in range(max_new_tokens):
        with autocast or contextlib.nullcontext():
            logits, _ = model(idx[:, -block_size:])
        logits = logits[:, -1, :GPT2_VOCAB_SIZE].float()  # padding rows of the vocabulary are not tokens
        if temperature == 0:
            next_token = logits.argmax(dim=-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                logits = logits.masked_fill(logits < kth, -float("inf"))
            probs = torch.softmax(logits, dim=-1)
            next_token = torch.multinomial(probs, num_samples=1, generator=generator)
        idx = torch.cat((idx, next_token), dim=1)
    return idx


def sample(checkpoint: Path, prompt: str, max_new_tokens: int, temperature: float, top_k: int | None, seed: int,
           num_samples: int = 1, device: str | torch.device = "auto") -> list[str]:
    """``num_samples`` continuations of ``prompt`` (an empty prompt starts from <|endoftext|>), prompt included."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    device = resolve_device(device)
    model, _ = load_model(Path(checkpoint), device, gpt2_text_for="sampling")
    encoding = gpt2_encoding()
    tokens = encoding.encode(prompt, allowed_special={"<|endoftext|>"}) or [GPT2_EOT_TOKEN]
    idx = torch.tensor([tokens] * num_samples, dtype=torch.long, device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    autocast = autocast_context(device, resolve_dtype(Precision.auto, device))
    out = generate(model, idx, max_new_tokens, temperature, top_k, generator, autocast)
    return [encoding.decode(row.tolist()) for row in out]


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(prog="python -m evaluation.sample", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="a checkpoint written by train.py, or a run directory (its newest checkpoint)")
    parser.add_argument("--prompt", default="", help="text to continue (default: start from <|endoftext|>)")
    parser.add_argument("--max-new-tokens", type=arguments.positive_int, default=100)
    parser.add_argument("--temperature", type=arguments.non_negative_float, default=0.8,
                        help="0: always the most likely token")
    parser.add_argument("--top-k", type=arguments.non_negative_int, default=200,
                        help="sample among the k most likely tokens (0: all)")
    parser.add_argument("--seed", type=arguments.seed, default=1337)
    parser.add_argument("--num-samples", type=arguments.positive_int, default=1)
    parser.add_argument("--device", type=arguments.device, default="auto", help="auto, cpu, cuda, cuda:N")
    args = parser.parse_args(argv)
    try:
        texts = sample(args.checkpoint, args.prompt, args.max_new_tokens, args.temperature, args.top_k or None,
                       args.seed, args.num_samples, args.device)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    for i, text in enumerate(texts):
        if i:
            sys.stdout.write("\n---------------\n")
        sys.stdout.write(text)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
