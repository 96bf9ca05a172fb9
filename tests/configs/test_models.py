from omegaconf import OmegaConf

from configs.models import GPT2_SHAPES, MODEL_DIR
from evaluation.downstream import model_size
from reporting.run_labels import SIZE_ORDER, model_label
from scripts.bench_optimizer import gpt2_shapes


def test_gpt2_sizes_are_read_from_their_model_configs_smallest_first():
    assert list(GPT2_SHAPES) == ["small", "medium", "large", "xl"]
    for size, shape in GPT2_SHAPES.items():
        model = OmegaConf.load(MODEL_DIR / f"gpt2-{size}.yaml")
        assert shape == (model.n_layer, model.n_head, model.n_embd)


def test_the_tables_the_downstream_scores_and_the_benches_name_the_sizes_the_model_configs_define():
    assert SIZE_ORDER == tuple(GPT2_SHAPES)
    for size, (n_layer, n_head, n_embd) in GPT2_SHAPES.items():
        model = {"n_layer": n_layer, "n_head": n_head, "n_embd": n_embd}
        assert model_label(model) == model_size(model) == size
        assert gpt2_shapes(size)[0] == (50304, n_embd) and len(gpt2_shapes(size)) == 3 + 6 * n_layer
