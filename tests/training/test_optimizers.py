from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from configs.compose import register_configs
from configs.registry import newton_schulz_dtype, param_groups
from mars.traits import trait
from model import ARCHITECTURES
from tests import tiny_models
from training.optimizers import build_optimizer, optimizer_class_and_arguments

CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "configs")
OPTIMIZERS = sorted(p.stem for p in Path(CONFIG_DIR, "optimizer").glob("*.yaml"))
register_configs()


def tiny_model(arch: str = "gpt2"):
    """A one-block model of ``arch``: GPT-2's with biases, so that every kind of tensor shows."""
    return tiny_models.tiny_model(arch, **({"bias": True} if arch == "gpt2" else {}))


def test_nanogpt_grouping_decays_matrices_only():
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.1, decay_embeddings=True)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_authors_grouping_keeps_embeddings_out_of_weight_decay():
    model = tiny_model()
    decay, no_decay = param_groups(model, 0.1, decay_embeddings=False)
    embeddings = {id(model.transformer.wte.weight), id(model.transformer.wpe.weight)}
    assert embeddings <= {id(p) for p in no_decay["params"]}
    assert not embeddings & {id(p) for p in decay["params"]}


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_config_builds_and_takes_a_step_on_every_model(name, arch):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"optimizer={name}"])
    model = tiny_model(arch)
    optimizer = build_optimizer(cfg.optimizer, model)
    # The registry's class: one of mars's (exported or not) or of torch.optim.
    expected, _ = optimizer_class_and_arguments(cfg.optimizer)
    assert type(optimizer) is expected and expected.__module__.split(".")[0] in ("mars", "torch")
    before = [p.detach().clone() for p in model.parameters()]
    idx = torch.randint(0, 64, (2, 8))
    model(idx, idx)[1].backward()

    def step():
        if getattr(optimizer, "needs_lookahead_grad", False):
            optimizer.stash_lookahead_grad()
        optimizer.step()

    # An optimizer whose first steps only initialise its state (ADOPT's) says so; torch.optim's move at once.
    for _ in range(trait(optimizer, "STATE_ONLY_STEPS")):
        step()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_mars_config_overrides_reach_the_optimizer():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["optimizer=mars-lion", "optimizer.gamma=0.05",
                                                       "optimizer.is_approx=false", "optimizer.lr=1e-3"])
    optimizer = build_optimizer(cfg.optimizer, tiny_model())
    group = optimizer.param_groups[0]
    assert (group["mars_type"], group["gamma"], group["lr"]) == ("mars-lion", 0.05, 1e-3)
    assert optimizer.needs_lookahead_grad


def test_muon_ns_dtype_override_reaches_the_optimizer_and_a_typo_is_named():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["optimizer=muon", "optimizer.ns_dtype=float32"])
        assert build_optimizer(cfg.optimizer, tiny_model()).param_groups[0]["ns_dtype"] == torch.float32
        cfg = compose(config_name="config", overrides=["optimizer=muon", "optimizer.ns_dtype=fp32"])
    with pytest.raises(ValueError, match="optimizer.ns_dtype must be one of .*'fp32'"):
        build_optimizer(cfg.optimizer, tiny_model())


def test_muon_defaults_to_the_authors_variant_and_its_options_reach_the_optimizer():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        group = build_optimizer(compose(config_name="config", overrides=["optimizer=muon"]).optimizer,
                                tiny_model()).param_groups[0]
        assert (group["adamw_variant"], group["update_dtype"]) == ("authors", torch.bfloat16)
        cfg = compose(config_name="config", overrides=["optimizer=muon", "optimizer.adamw_variant=torch",
                                                       "optimizer.update_dtype=float32"])
        group = build_optimizer(cfg.optimizer, tiny_model()).param_groups[0]
        assert (group["adamw_variant"], group["update_dtype"]) == ("torch", torch.float32)
        assert group["ns_form"] == "products"
        cfg = compose(config_name="config", overrides=["optimizer=muon", "optimizer.ns_form=fused_gram"])
        assert build_optimizer(cfg.optimizer, tiny_model()).param_groups[0]["ns_form"] == "fused_gram"
        cfg = compose(config_name="config", overrides=["optimizer=muon", "optimizer.update_dtype=fp32"])
    with pytest.raises(ValueError, match="optimizer.update_dtype must be one of .*'fp32'"):
        build_optimizer(cfg.optimizer, tiny_model())


@pytest.mark.parametrize("optimizer", ["muon", "mars-shampoo"])
def test_newton_schulz_precision_defaults_to_float32_on_cpus_and_bfloat16_on_cuda(optimizer, caplog):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"optimizer={optimizer}"])
    assert cfg.optimizer.ns_dtype == "auto"
    with caplog.at_level("INFO", logger="train"):
        assert build_optimizer(cfg.optimizer, tiny_model()).param_groups[0]["ns_dtype"] == torch.float32
    assert "Newton-Schulz in float32 on cpu (optimizer.ns_dtype=auto)" in caplog.text
    assert newton_schulz_dtype("auto", device=torch.device("cuda", 0)) == torch.bfloat16  # the authors'
    assert newton_schulz_dtype("bfloat16", device=torch.device("cpu")) == torch.bfloat16  # an explicit choice stays


def test_a_mars_variant_without_newton_schulz_does_not_log_its_precision(caplog):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["optimizer=mars-lion"])
    with caplog.at_level("INFO", logger="train"):
        build_optimizer(cfg.optimizer, tiny_model())
    assert cfg.optimizer.ns_dtype == "auto" and "Newton-Schulz" not in caplog.text


def test_triton_backend_on_a_cpu_run_is_refused_before_training_with_the_fix(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # tests/conftest.py sets it; a user's run does not
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["optimizer.backend=triton"])
    with pytest.raises(ValueError, match="optimizer.backend=triton needs a CUDA device.*optimizer.backend=auto"):
        build_optimizer(cfg.optimizer, tiny_model())


@pytest.mark.parametrize("name", ["mars-m", "moonlight"])
def test_mars_m_and_moonlight_route_matrices_to_their_rule_and_decay_every_tensor_as_the_authors(name):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"optimizer={name}", "optimizer.weight_decay=0.05"])
    model = tiny_model()
    matrices, others = build_optimizer(cfg.optimizer, model).param_groups
    named = {id(p): n for n, p in model.named_parameters()}
    # MARS_M/train_mars_m.py:212-219: >=2-D tensors without embed_tokens/lm_head/wpe/wte in their name.
    embeddings = ("transformer.wte", "transformer.wpe", "lm_head")
    assert sorted(named[id(p)] for p in matrices["params"]) == sorted(
        n for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(embeddings))
    assert {named[id(p)] for p in others["params"]} >= {"transformer.wte.weight", "transformer.wpe.weight"}
    assert (matrices["matrix_rule"], others["matrix_rule"]) == (True, False)
    assert matrices["weight_decay"] == others["weight_decay"] == 0.05


@pytest.mark.parametrize("optimizer, default", [("mars-m", "gram"), ("moonlight", "gram"), ("muon", "products"),
                                                ("mars-shampoo", "products")])
def test_ns_form_defaults_to_the_authors_order_and_reaches_the_optimizer(optimizer, default):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        for overrides, expected in (([], default), (["optimizer.ns_form=fused_gram"], "fused_gram")):
            cfg = compose(config_name="config", overrides=[f"optimizer={optimizer}", *overrides])
            groups = build_optimizer(cfg.optimizer, tiny_model()).param_groups
            assert {group["ns_form"] for group in groups} == {expected}


@pytest.mark.parametrize("optimizer", ["mars-m", "moonlight", "muon", "mars-shampoo"])
def test_ns_cuda_graph_is_off_by_default_reaches_a_cuda_optimizer_and_is_refused_on_the_cpu(optimizer):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"optimizer={optimizer}"])
        assert build_optimizer(cfg.optimizer, tiny_model()).ns_cuda_graph is False
        cfg = compose(config_name="config", overrides=[f"optimizer={optimizer}", "optimizer.ns_cuda_graph=true"])
        # The arguments only: building a CUDA optimizer needs no GPU, stepping one does.
        _, arguments = optimizer_class_and_arguments(cfg.optimizer, torch.device("cuda"))
        assert arguments["ns_cuda_graph"] is True
        with pytest.raises(ValueError, match="optimizer.ns_cuda_graph=true .* on cpu: set optimizer.ns_cuda_graph"):
            build_optimizer(cfg.optimizer, tiny_model())


@pytest.mark.parametrize("optimizer", ["mars-m", "moonlight", "muon", "mars-shampoo"])
def test_ns_batch_is_off_by_default_and_reaches_the_optimizer(optimizer):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        for overrides, expected in (([], False), (["optimizer.ns_batch=true"], True)):
            cfg = compose(config_name="config", overrides=[f"optimizer={optimizer}", *overrides])
            assert build_optimizer(cfg.optimizer, tiny_model()).ns_batch is expected


def test_the_memory_efficient_mars_m_has_no_exact_scheme():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["optimizer=mars-m", "optimizer.memory_efficient=true",
                                                       "optimizer.is_approx=false"])
    with pytest.raises(ValueError, match="memory_efficient=true has the approximate scheme only"):
        build_optimizer(cfg.optimizer, tiny_model())


LLAMA_MATRICES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj")


@pytest.mark.parametrize("name, embeddings_too", [("muon", True), ("mars-m", False), ("moonlight", False)])
def test_on_llama_the_orthogonalising_rules_take_the_attention_and_swiglu_matrices_and_adamw_the_norms(
        name, embeddings_too):
    """Muon orthogonalises every 2-D tensor as the MARS authors' Muon does on GPT-2 (its tied embedding too); MARS-M
    and Moonlight keep the embedding and the head out (``embed_tokens``, ``lm_head``: MARS_M/train_mars_m.py)."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=[f"optimizer={name}"])
    model = tiny_model("llama")
    optimizer = build_optimizer(cfg.optimizer, model)
    named = {id(p): n for n, p in model.named_parameters()}
    rules = {named[id(p)]: optimizer._rule(p, group) for group in optimizer.param_groups for p in group["params"]}
    embeddings = {"embed_tokens.weight", "lm_head.weight"}
    matrices = {n for n in named.values() if n.removesuffix(".weight").split(".", 2)[-1] in LLAMA_MATRICES}
    assert len(matrices) == 7 and {n for n, rule in rules.items() if rule == "matrices"} == (
        matrices | embeddings if embeddings_too else matrices)
    assert {n for n, rule in rules.items() if rule == "others"} >= {"norm.weight", "layers.0.input_layernorm.weight",
                                                                      "layers.0.post_attention_layernorm.weight"}


@pytest.mark.parametrize("optimize_1d", [False, True])
def test_on_llama_mars_takes_its_rule_on_the_matrices_and_the_norms_only_with_optimize_1d(optimize_1d):
    from mars.reference import uses_mars_rule

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="config", overrides=["optimizer=mars-adamw", f"optimizer.optimize_1d={optimize_1d}"])
    model = tiny_model("llama")
    optimizer = build_optimizer(cfg.optimizer, model)
    named = {id(p): n for n, p in model.named_parameters()}
    mars_rule = {named[id(p)] for group in optimizer.param_groups for p in group["params"]
                 if uses_mars_rule(p, group["optimize_1d"])}
    norms = {n for n in named.values() if n.endswith("norm.weight")}
    assert len(norms) == 3 and bool(norms & mars_rule) == optimize_1d
    assert {n for n, p in model.named_parameters() if p.dim() == 2} <= mars_rule
