"""GPT-2's sizes as configs/model/gpt2-<size>.yaml define them: the one place they are written."""
from pathlib import Path

from omegaconf import OmegaConf

MODEL_DIR = Path(__file__).resolve().parent / "model"


def gpt2_shapes() -> dict[str, tuple[int, int, int]]:
    """{size: (n_layer, n_head, n_embd)} of every configs/model/gpt2-<size>.yaml, smallest first."""
    shapes = {}
    for path in MODEL_DIR.glob("gpt2-*.yaml"):
        model = OmegaConf.load(path)
        shapes[path.stem.removeprefix("gpt2-")] = (model.n_layer, model.n_head, model.n_embd)
    return dict(sorted(shapes.items(), key=lambda item: item[1]))


GPT2_SHAPES = gpt2_shapes()  # {"small": (12, 12, 768), ..., "xl": (48, 25, 1600)}
