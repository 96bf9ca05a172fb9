"""How the tables and figures name runs: model sizes, optimizer labels (and the optimizer settings that tell two
runs of one optimizer apart), corpora, token counts and code, each as the paper (or a reader) calls it, and the
orders they are shown in.

A corpus is a named one wherever it lies, or else the shard directory it was read from (:func:`corpus_of`); a
token budget is stated as the paper states it (4.92B is 5B, :func:`nominal_tokens`).
Used by ``reporting.run_reading``, ``reporting.run_selection``, the table and the figures.
"""
import dataclasses
import itertools
import math
import os
from collections.abc import Collection
from pathlib import Path

from configs.models import GPT2_SHAPES, LLAMA_SHAPES
from configs.registry import OPTIMIZERS
from data.corpora import CUSTOM, EMBEDDED

MODEL_SIZES = {shape: size for size, shape in GPT2_SHAPES.items()}
LLAMA_SIZES = {shape: f"llama-{size}" for size, shape in LLAMA_SHAPES.items()}
SIZE_ORDER = (*GPT2_SHAPES, *LLAMA_SIZES.values())
CORPUS_NAMES = {"openwebtext": "OpenWebText", "fineweb-edu": "FineWeb-Edu", "c4": "C4",
                "embedded": "Shakespeare (embedded)"}
# Each optimizer label's display name, in the tables' order.
OPTIMIZER_NAMES = {label: name for entry in OPTIMIZERS.values() for label, name in entry.labels.items()}


def model_label(model_cfg) -> str:
    """``small`` (GPT-2's sizes), ``llama-60m``; another shape by its depth and width (``llama-`` for LLaMA's)."""
    shape = (model_cfg["n_layer"], model_cfg["n_head"], model_cfg["n_embd"])
    if model_cfg.get("arch", "gpt2") == "llama":
        return LLAMA_SIZES.get((*shape, model_cfg["intermediate_size"]), f"llama-{shape[0]}x{shape[2]}")
    return MODEL_SIZES.get(shape, f"{shape[0]}x{shape[2]}")


def optimizer_label(optimizer_cfg) -> str:
    """The optimizer's label (``mars-approx``); an optimizer this version does not know keeps its name."""
    entry = OPTIMIZERS.get(optimizer_cfg["name"])
    return entry.label(optimizer_cfg) if entry else optimizer_cfg["name"]


def nominal_tokens(tokens: float) -> float:
    """A token budget as the paper states it: 1, 2 or 5 x 10^k if within 2% of one (4.92B is 5B), else as is."""
    if tokens <= 0:
        return tokens
    exponent = math.floor(math.log10(tokens))
    nice = (m * 10.0 ** e for m in (1, 2, 5) for e in (exponent - 1, exponent, exponent + 1))
    return next((n for n in nice if abs(tokens - n) <= 0.02 * n), tokens)


def tokens_label(tokens: float) -> str:
    """5B, 20B, 1.2M, 64: the nominal token count in 3 significant digits."""
    return count_label(nominal_tokens(tokens))


def count_label(count: float) -> str:
    """4.92B, 1.23M, 64: a count in 3 significant digits."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{unit}"
    return f"{count:.3g}"


def corpus_of(data_cfg: dict) -> str:
    """What a run trains and is evaluated on: a named corpus wherever it lies (``openwebtext``), or else the
    shard directory (``custom:/data/shards``)."""
    name = data_cfg["name"]
    if name == EMBEDDED and data_cfg.get("dir"):
        name = CUSTOM  # the embedded corpus has no data.dir: the run read that directory (recorded before the fix)
    if name in CORPUS_NAMES or not data_cfg.get("dir"):
        return name
    return f"{name}:{os.path.normpath(data_cfg['dir'])}"


def short_corpus_names(corpora: Collection[str]) -> dict[str, str]:
    """Names that tell ``corpora`` apart, for tables and file names: a named corpus' own; else its name and its
    shard directory's, with as many parent directories as it takes (``custom-a-shards``, ``custom-b-shards``)."""
    directories = {corpus: directory_parts(corpus.partition(":")[2]) for corpus in corpora if ":" in corpus}
    names = {corpus: corpus for corpus in corpora if corpus not in directories}
    for corpus, parts in directories.items():
        shared = max((common_tail_length(parts, other) for c, other in directories.items() if c != corpus),
                     default=0)
        names[corpus] = "-".join([corpus.partition(":")[0], *parts[-(shared + 1):]])
    return names


def directory_parts(directory: str) -> tuple[str, ...]:
    """The names of a path's directories, without its root (``/data/shards``: data, shards)."""
    path = Path(directory)
    return path.parts[1:] if path.anchor else path.parts


def common_tail_length(parts: tuple[str, ...], other: tuple[str, ...]) -> int:
    """How many trailing names two paths share."""
    return sum(1 for _ in itertools.takewhile(lambda pair: pair[0] == pair[1], zip(reversed(parts), reversed(other))))


# Optimizer keys that do not change what a run computes: how Newton-Schulz is launched (the same kernels).
NO_EFFECT_KEYS = ("ns_cuda_graph",)


def without_defaults(optimizer_cfg: dict) -> dict:
    """The optimizer settings that differ from the schema's defaults, without those that change nothing.

    A MARS-AdamW run saved with another ``ns_dtype`` (its default changed once) ran the same thing as one at the
    default: it never runs Newton-Schulz (``OptimizerEntry.unread_keys``).
    """
    entry = OPTIMIZERS.get(optimizer_cfg.get("name"))
    if entry is None:
        return optimizer_cfg
    defaults = {f.name: f.default for f in dataclasses.fields(entry.schema) if f.default is not dataclasses.MISSING}
    ignored = NO_EFFECT_KEYS + entry.unread_keys(optimizer_cfg)
    return {key: value for key, value in optimizer_cfg.items()
            if key not in ignored and (key not in defaults or value != as_yaml(defaults[key]))}


def as_yaml(value):
    """A schema default as it reads back from a saved config (tuples become lists)."""
    return list(value) if isinstance(value, tuple) else value


def code_label(launch: dict) -> str:
    """A launch's code as a table shows it: the commit's first 7 digits, ``+`` if it ran uncommitted changes
    (saved in the run's ``code/`` directory; new source files among them), then the patch's first 7 digits where
    the record has them (two runs of one commit with other changes differ), ``unknown`` where it ran outside a
    git checkout."""
    if launch["commit"] is None:
        return "unknown"
    if not launch["patch"]:
        return launch["commit"][:7]
    return f"{launch['commit'][:7]}+{(launch.get('patch_sha256') or '')[:7]}"


def data_label(data: dict | None) -> str:
    """``HuggingFaceFW/fineweb-edu sample-100BT, 96,000,000,000 train tokens``, or ``not recorded``."""
    if data is None:
        return "not recorded"
    train = data.get("train", {})
    size = f"{train.get('tokens', 0):,} train tokens"
    return f"{train['source']}, {size}" if train.get("source") else size


def size_order(model: str) -> tuple[int, str]:
    return (SIZE_ORDER.index(model) if model in SIZE_ORDER else len(SIZE_ORDER), model)


def optimizer_order(optimizer: str) -> tuple[int, str]:
    names = list(OPTIMIZER_NAMES)
    return (names.index(optimizer) if optimizer in names else len(names), optimizer)


def numeric_order(values) -> tuple:
    """A sort key that puts numbers in numeric order (0.005 before 0.025 before 0.05), before anything else."""
    return tuple((0, value, "") if isinstance(value, int | float) and not isinstance(value, bool)
                 else (1, 0, str(value)) for value in values)


def display_corpus(corpus: str) -> str:
    return CORPUS_NAMES.get(corpus, corpus)


def display_model(model: str) -> str:
    if model in LLAMA_SIZES.values():
        return f"LLaMA {model.removeprefix('llama-')}"
    return f"GPT-2 {model}" if model in GPT2_SHAPES else model


def display_optimizer(optimizer: str) -> str:
    return OPTIMIZER_NAMES.get(optimizer, optimizer)


def other_learning_rates(optimizer_cfg: dict) -> dict[str, float]:
    """The configured rates of the optimizer's parts beside ``lr`` (its schema's ``proportional_lrs`` and
    ``part_lrs``: MARS's lr_1d, Muon's adamw_lr), by key."""
    entry = OPTIMIZERS.get(optimizer_cfg["name"])
    keys = (*entry.schema.proportional_lrs, *entry.schema.part_lrs) if entry else ()
    return {key: optimizer_cfg[key] for key in keys if key in optimizer_cfg}
