"""The models a run can train, by ``model.arch``: GPT-2 (model/gpt.py) and a LLaMA-style decoder (model/llama.py).

A run's ``model`` config section holds the keys of every architecture (configs/schema.py ``ModelConfig``); each
model takes its own, and a key of another architecture set away from its default is refused, naming it.
"""
import dataclasses
from collections.abc import Mapping

from torch import nn

from model.gpt import GPT, GPTConfig
from model.llama import Llama, LlamaConfig

ARCHITECTURES: dict[str, tuple[type[nn.Module], type]] = {"gpt2": (GPT, GPTConfig), "llama": (Llama, LlamaConfig)}


def model_config(section: Mapping) -> GPTConfig | LlamaConfig:
    """The model config of a ``model`` section (a run's, or a checkpoint's; one without ``arch`` is GPT-2's)."""
    arch = section.get("arch", "gpt2")
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    config_class = ARCHITECTURES[arch][1]
    own = {f.name for f in dataclasses.fields(config_class)}
    others = {f.name: f.default for name, (_, other) in ARCHITECTURES.items() if name != arch
              for f in dataclasses.fields(other) if f.name not in own}
    for key, value in section.items():
        if key != "arch" and key not in own and (key not in others or value != others[key]):
            raise ValueError(f"{key}={value} is not an option of the {arch} model: remove it (its options are "
                             f"{', '.join(sorted(own))})")
    return config_class(**{key: value for key, value in section.items() if key in own})


def build_model(config: GPTConfig | LlamaConfig) -> nn.Module:
    """The model of a config that ``model_config`` made."""
    return next(model_class for model_class, config_class in ARCHITECTURES.values()
                if isinstance(config, config_class))(config)


def arch_of(config: GPTConfig | LlamaConfig) -> str:
    """The ``model.arch`` of a model config."""
    return next(arch for arch, (_, config_class) in ARCHITECTURES.items() if isinstance(config, config_class))


__all__ = ["ARCHITECTURES", "GPT", "GPTConfig", "Llama", "LlamaConfig", "arch_of", "build_model", "model_config"]
