import math

import pytest
import torch
from torch import nn

from model import GPT, GPTConfig

# Parameter counts of OpenAI's released GPT-2 checkpoints (vocab 50257, biases on), tied lm_head counted once.
OPENAI_GPT2_PARAMS = {
    (12, 12, 768): 124_439_808,
    (24, 16, 1024): 354_823_168,
    (36, 20, 1280): 774_030_080,
    (48, 25, 1600): 1_557_611_200,
}


@pytest.mark.parametrize("shape, expected", OPENAI_GPT2_PARAMS.items())
def test_param_count_from_config_matches_openai_gpt2(shape, expected):
    n_layer, n_head, n_embd = shape
    config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=50257, bias=True)
    assert config.num_params(non_embedding=False) == expected


@pytest.mark.parametrize("shape, expected", OPENAI_GPT2_PARAMS.items())
def test_padded_vocab_no_bias_sizes_stay_within_one_percent_of_gpt2(shape, expected):
    n_layer, n_head, n_embd = shape
    config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    assert abs(config.num_params(non_embedding=False) - expected) / expected < 0.01


@pytest.mark.parametrize("bias", [False, True])
def test_config_count_equals_allocated_parameters(bias):
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=100, bias=bias)
    model = GPT(config)
    assert sum(p.numel() for p in model.parameters()) == config.num_params(non_embedding=False)
    assert model.transformer.wte.weight is model.lm_head.weight


def test_logits_shape_and_future_tokens_do_not_change_past_logits():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=100)).eval()
    idx = torch.randint(0, 100, (2, 12))
    changed = idx.clone()
    changed[:, 8:] = torch.randint(0, 100, (2, 4))
    logits, loss = model(idx)
    assert logits.shape == (2, 12, 100) and loss is None
    logits_changed, _ = model(changed)
    torch.testing.assert_close(logits[:, :8], logits_changed[:, :8])
    assert not torch.allclose(logits[:, 8:], logits_changed[:, 8:])


def test_loss_at_init_is_close_to_uniform_over_the_vocabulary():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32))
    idx, targets = torch.randint(0, 50257, (2, 4, 32))
    _, loss = model(idx, targets)
    assert loss.item() == pytest.approx(math.log(50304), abs=0.05)


def test_residual_projections_use_the_scaled_init():
    torch.manual_seed(0)
    n_layer = 8
    model = GPT(GPTConfig(n_layer=n_layer, n_head=4, n_embd=256, block_size=16, vocab_size=100))
    proj_std = model.transformer.h[0].mlp.c_proj.weight.std().item()
    fc_std = model.transformer.h[0].mlp.c_fc.weight.std().item()
    assert proj_std == pytest.approx(0.02 / math.sqrt(2 * n_layer), rel=0.05)
    assert fc_std == pytest.approx(0.02, rel=0.05)


def initial_weights_in_the_authors_order(config, seed):
    """{name: tensor} of a GPT drawn as AGI-Arena/MARS MARS/model.py:126-151 draws it after
    ``torch.manual_seed(seed)``: every Linear and Embedding takes torch's default init as it is built (wte, wpe,
    then per block c_attn, attn c_proj, c_fc, mlp c_proj, then lm_head), then each is redrawn N(0, 0.02) in
    module order (wte's draw lands in the tied head and is redrawn by lm_head's), then every c_proj N(0, 0.02 /
    sqrt(2 n_layer))."""
    torch.manual_seed(seed)
    c = config.n_embd

    def linear(fan_in, fan_out):
        return nn.Linear(fan_in, fan_out, bias=config.bias)

    wte, wpe = nn.Embedding(config.vocab_size, c), nn.Embedding(config.block_size, c)
    blocks = [dict(zip(("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"),
                       (linear(c, 3 * c), linear(c, c), linear(c, 4 * c), linear(4 * c, c))))
              for _ in range(config.n_layer)]
    head = nn.Linear(c, config.vocab_size, bias=False)
    for module in [wte, wpe, *(m for block in blocks for m in block.values()), head]:
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    for block in blocks:
        for name in ("attn.c_proj", "mlp.c_proj"):
            nn.init.normal_(block[name].weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
    weights = {"transformer.wte.weight": head.weight, "transformer.wpe.weight": wpe.weight}
    for i, block in enumerate(blocks):
        for name, module in block.items():
            weights[f"transformer.h.{i}.{name}.weight"] = module.weight
            if config.bias:
                weights[f"transformer.h.{i}.{name}.bias"] = module.bias
    return weights


@pytest.mark.parametrize("bias", [False, True])
def test_initial_weights_are_the_authors_draw_for_the_same_seed(bias):
    # The presets seed 5000, as the authors' trainers do on rank 0 (whose weights DDP gives every rank), so a
    # preset run starts from their initial weights only if the model draws in their order.
    config = GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=50, bias=bias)
    expected = initial_weights_in_the_authors_order(config, seed=5000)
    torch.manual_seed(5000)
    model = GPT(config)
    drawn = {name: p for name, p in model.named_parameters() if not name.split(".")[-2].startswith("ln_")}
    assert drawn.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(drawn[name], tensor), name


def test_sequence_longer_than_context_is_rejected():
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=10))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_flops_per_token_follows_6n_plus_attention_term():
    config = GPTConfig()
    assert config.flops_per_token(1024) == 6 * config.num_params() + 12 * 12 * 12 * 64 * 1024


def test_inverse_layer_scaling_divides_each_layers_attention_scores_by_its_depth():
    torch.manual_seed(0)
    config = GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=50,
                       scale_attn_by_inverse_layer_idx=True)
    attention = GPT(config).transformer.h[2].attn
    x = torch.randn(2, 8, 16)
    q, k, v = (t.view(2, 8, 2, 8).transpose(1, 2) for t in attention.c_attn(x).split(16, dim=2))
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(8) / 3  # third layer: divided by 3
    scores = scores.masked_fill(torch.triu(torch.ones(8, 8, dtype=torch.bool), 1), float("-inf"))
    expected = attention.c_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 8, 16))
    torch.testing.assert_close(attention(x), expected)


def authors_new_gelu(x):
    """The MARS authors' MLP activation (AGI-Arena/MARS MARS/model.py:20-25), written from its formula."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def test_gelu_tanh_is_the_authors_activation_and_differs_from_exact_gelu():
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    tanh_mlp = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=10, activation="gelu_tanh"))
    exact_mlp = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=10))
    tanh_gelu, exact_gelu = tanh_mlp.transformer.h[0].mlp.gelu, exact_mlp.transformer.h[0].mlp.gelu
    torch.testing.assert_close(tanh_gelu(x), authors_new_gelu(x), rtol=1e-12, atol=1e-12)
    # The two GELUs differ by up to ~1e-3 (near |x| = 2): a real difference, not rounding.
    assert (tanh_gelu(x) - exact_gelu(x)).abs().max() > 1e-4
    torch.testing.assert_close(exact_gelu(x), 0.5 * x * (1 + torch.erf(x / math.sqrt(2))), rtol=1e-12, atol=1e-12)


def test_unknown_activation_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="activation must be one of gelu, gelu_tanh"):
        GPTConfig(activation="relu")


@pytest.mark.parametrize("field, value, message", [("n_layer", 0, "n_layer must be positive"),
                                                   ("vocab_size", -1, "vocab_size must be positive"),
                                                   ("dropout", 1.0, r"dropout must be in \[0, 1\)"),
                                                   ("n_head", 5, r"n_head \(5\) must divide n_embd \(768\)")])
def test_a_shape_no_model_can_have_is_refused_by_the_config_itself(field, value, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{field: value})
