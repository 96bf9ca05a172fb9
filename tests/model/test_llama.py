import math

import pytest
import torch
import transformers

from configs.models import LLAMA_SHAPES, MODEL_DIR
from model import Llama, LlamaConfig, build_model, model_config
from omegaconf import OmegaConf

TINY = dict(n_layer=2, n_head=4, n_embd=32, intermediate_size=88, block_size=48, vocab_size=101)


def hf_llama_config(config: LlamaConfig) -> transformers.LlamaConfig:
    """transformers' config of the same network (the export's mapping is tested in tests/evaluation)."""
    return transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.n_embd, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.n_layer, num_attention_heads=config.n_head, max_position_embeddings=config.block_size,
        rms_norm_eps=config.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_embeddings, attn_implementation="sdpa")


def perturbed_llama(config: LlamaConfig) -> Llama:
    """Random weights away from the init (norm weights not all one), so that every parameter's role shows."""
    torch.manual_seed(0)
    model = Llama(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model


def hf_copy(model: Llama) -> transformers.LlamaForCausalLM:
    hf = transformers.LlamaForCausalLM(hf_llama_config(model.config)).eval()
    weights = {name if name.startswith("lm_head") else f"model.{name}": w for name, w in model.state_dict().items()}
    hf.load_state_dict(weights, strict=True)
    return hf


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_logits_and_loss_equal_transformers_llama_of_the_same_config_and_weights(tie):
    model = perturbed_llama(LlamaConfig(**TINY, tie_embeddings=tie, rope_theta=500.0))
    hf = hf_copy(model)
    tokens = torch.randint(0, TINY["vocab_size"], (3, 41), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, _ = model(tokens)
        expected = hf(tokens, labels=tokens)
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        model.loss_chunk_size = 16
        _, chunked_loss = model(tokens[:, :-1], tokens[:, 1:])
    torch.testing.assert_close(logits, expected.logits)
    torch.testing.assert_close(loss, expected.loss)
    torch.testing.assert_close(chunked_loss, expected.loss)


def test_gradients_equal_transformers_llama():
    model = perturbed_llama(LlamaConfig(**TINY)).train()
    hf = hf_copy(model).train()
    tokens = torch.randint(0, TINY["vocab_size"], (2, 33), generator=torch.Generator().manual_seed(2))
    model(tokens[:, :-1], tokens[:, 1:])[1].backward()
    hf(tokens, labels=tokens).loss.backward()
    theirs = dict(hf.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, theirs[name if name.startswith("lm_head") else f"model.{name}"].grad)


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_config_count_equals_allocated_parameters_and_transformers_count(tie):
    config = LlamaConfig(**TINY, tie_embeddings=tie)
    model = Llama(config)
    allocated = sum(p.numel() for p in model.parameters())
    assert allocated == config.num_params(non_embedding=False) == hf_copy(model).num_parameters()
    assert (model.embed_tokens.weight is model.lm_head.weight) == tie
    table = TINY["vocab_size"] * TINY["n_embd"]
    assert config.num_params() == allocated - (0 if tie else table)  # the head multiplies; a lookup does not


@pytest.mark.parametrize("size", list(LLAMA_SHAPES))
def test_every_llama_model_config_counts_what_transformers_allocates(size):
    config = model_config(OmegaConf.to_container(OmegaConf.load(MODEL_DIR / f"llama-{size}.yaml")))
    with torch.device("meta"):
        hf = transformers.LlamaForCausalLM(hf_llama_config(config))
    assert config.num_params(non_embedding=False) == hf.num_parameters()


def test_galore_sizes_have_the_parameter_counts_their_names_say():
    """58M, 134M, 368M and 1.34B: the counts GaLore's tables round to 60M, 130M, 350M and 1B."""
    counts = {size: model_config(OmegaConf.to_container(OmegaConf.load(MODEL_DIR / f"llama-{size}.yaml")))
              .num_params(non_embedding=False) for size in ("60m", "130m", "350m", "1b")}
    assert counts == {"60m": 58_073_600, "130m": 134_105_856, "350m": 367_969_280, "1b": 1_339_082_752}


def test_init_draws_every_matrix_at_std_0_02_without_depth_scaling_and_norms_at_one():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(n_layer=8, n_head=4, n_embd=256, intermediate_size=512, block_size=16,
                              vocab_size=1000))
    for name, param in model.named_parameters():
        if param.dim() == 2:
            assert param.std().item() == pytest.approx(0.02, rel=0.05), name
        else:
            assert torch.equal(param, torch.ones_like(param)), name
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert model.embed_tokens.weight is not model.lm_head.weight


def test_loss_at_init_is_close_to_uniform_and_future_tokens_do_not_change_past_logits():
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**TINY, "vocab_size": 50304})).eval()
    idx = torch.randint(0, 50257, (2, 32))
    logits, _ = model(idx)
    _, loss = model(idx, idx)
    assert loss.item() == pytest.approx(math.log(50304), abs=0.05)
    changed = idx.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 50257
    torch.testing.assert_close(model(changed)[0][:, :20], logits[:, :20])
    assert not torch.allclose(model(changed)[0][:, 20:], logits[:, 20:])


def test_positions_matter_unlike_a_bag_of_tokens():
    """Rotary embeddings: the same tokens in another order give another last logit."""
    model = perturbed_llama(LlamaConfig(**TINY))
    idx = torch.arange(10).unsqueeze(0)
    reordered = torch.cat((idx[:, :9].flip(1), idx[:, 9:]), dim=1)
    assert not torch.allclose(model(idx)[0][:, -1], model(reordered)[0][:, -1])


@pytest.mark.slow
def test_compiled_llama_gives_the_eager_loss_and_gradients():
    model = perturbed_llama(LlamaConfig(**TINY)).train()
    tokens = torch.randint(0, TINY["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(3))
    results = []
    for forward in (model, torch.compile(model)):
        model.zero_grad(set_to_none=True)
        loss = forward(tokens[:, :-1], tokens[:, 1:])[1]
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (eager_loss, eager_grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, eager_loss)
    for compiled, eager in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(compiled, eager)


def test_sequence_longer_than_context_is_rejected():
    model = Llama(LlamaConfig(**{**TINY, "block_size": 4}))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_flops_per_token_follows_6n_plus_attention_term():
    config = LlamaConfig()
    assert config.flops_per_token(256) == 6 * config.num_params() + 12 * 12 * 768 * 256


@pytest.mark.parametrize("field, value, message", [
    ("n_head", 5, "must divide n_embd"), ("n_head", 32, "even width"), ("intermediate_size", 0, "positive"),
    ("rms_norm_eps", 0.0, "positive")])
def test_a_shape_no_llama_can_have_is_refused_by_the_config_itself(field, value, message):
    with pytest.raises(ValueError, match=message):
        LlamaConfig(**{**TINY, field: value})


def test_a_model_section_builds_the_model_of_its_arch_and_refuses_another_archs_option():
    llama = {"arch": "llama", **TINY, "activation": "gelu", "bias": False}  # GPT-2's keys at their defaults
    assert type(build_model(model_config(llama))) is Llama
    with pytest.raises(ValueError, match="activation=gelu_tanh is not an option of the llama model"):
        model_config({**llama, "activation": "gelu_tanh"})
    with pytest.raises(ValueError, match="tie_embeddings=True is not an option of the gpt2 model"):
        model_config({"n_layer": 1, "n_head": 1, "n_embd": 8, "tie_embeddings": True})
    with pytest.raises(ValueError, match="arch must be one of gpt2, llama, got 'mamba'"):
        model_config({"arch": "mamba"})
