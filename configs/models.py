"""The model sizes as configs/model/ defines them, the one place they are written: GPT-2's (gpt2-<size>.yaml) and
the LLaMA ones (llama-<size>.yaml)."""
from pathlib import Path

from omegaconf import OmegaConf

MODEL_DIR = Path(__file__).resolve().parent / "model"


def model_shapes(arch: str, keys: tuple[str, ...]) -> dict[str, tuple[int, ...]]:
    """{size: (the values of ``keys``)} of every configs/model/<arch>-<size>.yaml, smallest first."""
    shapes = {}
    for path in MODEL_DIR.glob(f"{arch}-*.yaml"):
        model = OmegaConf.load(path)
        shapes[path.stem.removeprefix(f"{arch}-")] = tuple(model[key] for key in keys)
    return dict(sorted(shapes.items(), key=lambda item: item[1]))


def gpt2_shapes() -> dict[str, tuple[int, int, int]]:
    """{size: (n_layer, n_head, n_embd)} of every configs/model/gpt2-<size>.yaml, smallest first."""
    return model_shapes("gpt2", ("n_layer", "n_head", "n_embd"))


GPT2_SHAPES = gpt2_shapes()  # {"small": (12, 12, 768), ..., "xl": (48, 25, 1600)}
# {"tiny": (4, 4, 128, 352), "60m": (8, 8, 512, 1376), ..., "1b": (24, 32, 2048, 5461)}
LLAMA_SHAPES = model_shapes("llama", ("n_layer", "n_head", "n_embd", "intermediate_size"))
