"""GPT-2's tokenizer without a network: tiktoken's Encoding built from ranks that ship with this package."""
import functools
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str

GPT2_RANKS_FILE = Path(__file__).parent / "assets" / "gpt2.tiktoken"
GPT2_EOT_TOKEN = 50256
GPT2_VOCAB_SIZE = 50257


@functools.cache
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 encoding: "Hello world" -> [15496, 995], "<|endoftext|>" -> 50256.

    Built from the bundled rank file so that tests and the default run never touch the network; if the file
    is missing (a stripped install), tiktoken's own download path is the fallback.
    """
    if not GPT2_RANKS_FILE.is_file():
        return tiktoken.get_encoding("gpt2")
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=r50k_pat_str,
        mergeable_ranks=load_tiktoken_bpe(str(GPT2_RANKS_FILE)),
        special_tokens={"<|endoftext|>": GPT2_EOT_TOKEN},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )
