"""One-block models of each architecture (model.ARCHITECTURES), for the tests that run every model."""
import torch
from torch import nn

from model import build_model, model_config


def tiny_model(arch: str = "gpt2", **overrides) -> nn.Module:
    """A one-block model of ``arch``, 16 wide, 8 tokens of context, 64 token ids, drawn from seed 0; ``overrides``
    are its ``model`` config's."""
    torch.manual_seed(0)
    own = {"intermediate_size": 24} if arch == "llama" else {}
    return build_model(model_config({"arch": arch, "n_layer": 1, "n_head": 2, "n_embd": 16, "block_size": 8,
                                     "vocab_size": 64, **own, **overrides}))
