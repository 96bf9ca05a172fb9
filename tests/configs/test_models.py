import dataclasses

import pytest
import torch
from omegaconf import MISSING, OmegaConf

from configs.compose import compose_config, validate
from configs.models import GPT2_SHAPES, LLAMA_SHAPES, MODEL_DIR
from configs.schema import ModelConfig
from evaluation.downstream import model_size
from model import ARCHITECTURES, arch_of, build_model, model_config
from reporting.run_labels import SIZE_ORDER, display_model, model_label
from scripts.bench_optimizer import gpt2_shapes


def test_gpt2_sizes_are_read_from_their_model_configs_smallest_first():
    assert list(GPT2_SHAPES) == ["small", "medium", "large", "xl"]
    for size, shape in GPT2_SHAPES.items():
        model = OmegaConf.load(MODEL_DIR / f"gpt2-{size}.yaml")
        assert shape == (model.n_layer, model.n_head, model.n_embd)


def test_the_tables_the_downstream_scores_and_the_benches_name_the_sizes_the_model_configs_define():
    assert SIZE_ORDER[:len(GPT2_SHAPES)] == tuple(GPT2_SHAPES)
    for size, (n_layer, n_head, n_embd) in GPT2_SHAPES.items():
        model = {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}
        assert model_label(model) == model_size(model) == size
        assert gpt2_shapes(size)[0] == (50304, n_embd) and len(gpt2_shapes(size)) == 3 + 6 * n_layer


MODEL_PRESETS = sorted(path.stem for path in MODEL_DIR.glob("*.yaml"))


@pytest.mark.parametrize("preset", MODEL_PRESETS)
def test_every_model_config_composes_validates_and_counts_what_its_model_allocates(preset):
    cfg = compose_config([f"model={preset}"])
    validate(cfg)
    config = model_config(OmegaConf.to_container(cfg.model))
    assert arch_of(config) == cfg.model.arch
    with torch.device("meta"):  # the sizes of GPT-2 XL and LLaMA 1B, without their memory
        model = build_model(config)
    assert sum(p.numel() for p in model.parameters()) == config.num_params(non_embedding=False)


def test_the_schema_defaults_of_every_architectures_keys_are_that_architectures_own():
    schema = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    for _, config_class in ARCHITECTURES.values():
        for f in dataclasses.fields(config_class):
            assert schema[f.name] in (f.default, MISSING), (config_class.__name__, f.name)


def test_llama_runs_are_labelled_by_their_size_and_not_as_the_gpt2_of_their_shape():
    assert list(LLAMA_SHAPES) == ["tiny", "60m", "130m", "350m", "1b"]
    for size, (n_layer, n_head, n_embd, intermediate_size) in LLAMA_SHAPES.items():
        model = {"arch": "llama", "n_layer": n_layer, "n_head": n_head, "n_embd": n_embd,
                 "intermediate_size": intermediate_size}
        assert model_label(model) == f"llama-{size}" and display_model(model_label(model)) == f"LLaMA {size}"
    assert model_label({"n_layer": 12, "n_head": 12, "n_embd": 768}) == "small"  # LLaMA 130M's shape, GPT-2's
    assert model_label({"arch": "llama", "n_layer": 3, "n_head": 2, "n_embd": 64, "intermediate_size": 9}) == \
        "llama-3x64"
