"""The paper's runs as presets (configs/experiment/): each composes, validates, and trains the model with the
optimizer, on the corpus and for the token budget that its name states, with the authors' hyperparameters."""
import functools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from configs.compose import register_configs, validate
from configs.schema import ConfigError, grad_accum_steps_for
from data.corpora import data_root
from tests.configs.authors_runs import OURS, OURS_BY_OPTIMIZER, RUNS, authors_settings
from training.resume import flat_items

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
# The MARS papers' GPT-2 runs; the LLaMA-on-C4 presets (c4-llama-*) are tests/configs/test_c4_presets.py's.
PRESETS = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml") if not path.stem.startswith("c4-"))
NAME = re.compile(r"(?P<corpus>owt|fwe)-gpt2-(?P<size>small|medium|large|xl)-(?P<billions>\d+)b-"
                  r"(?P<optimizer>adamw|muon|mars-approx|mars-exact|mars-m|moonlight)")
CORPORA = {"owt": "openwebtext", "fwe": "fineweb-edu"}
SIZES = {"small": (12, 12, 768), "medium": (24, 16, 1024), "large": (36, 20, 1280), "xl": (48, 25, 1600)}
register_configs()


@functools.cache
def load(*overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def test_every_run_the_paper_reports_has_a_preset():
    owt = [f"owt-gpt2-{size}-{billions}b-{optimizer}" for size in ("small", "medium", "large")
           for billions in (5, 20, 50) for optimizer in ("adamw", "muon", "mars-approx")]
    exact = [f"owt-gpt2-small-{billions}b-mars-exact" for billions in (5, 20, 50)]
    fineweb = [f"fwe-gpt2-{size}-50b-{optimizer}" for size in ("small", "xl") for optimizer in ("adamw", "mars-approx")]
    # The second paper's scripts (MARS_M/scripts/run_{mars_m,moonlight}_{small,medium,large,small_fw,xl_fw}.sh).
    mars_m = [f"owt-gpt2-{size}-50b-{optimizer}" for size in ("small", "medium", "large")
              for optimizer in ("mars-m", "moonlight")]
    mars_m += [f"fwe-gpt2-{size}-50b-{optimizer}" for size in ("small", "xl") for optimizer in ("mars-m", "moonlight")]
    assert PRESETS == sorted(owt + exact + fineweb + mars_m)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_validates_and_runs_what_its_name_says(name):
    parts = NAME.fullmatch(name)
    assert parts, f"{name} does not follow <corpus>-gpt2-<size>-<tokens>b-<optimizer>"
    cfg = load(f"experiment={name}")
    validate(cfg)
    m, t, o = cfg.model, cfg.train, cfg.optimizer
    assert (m.n_layer, m.n_head, m.n_embd) == SIZES[parts["size"]]
    assert cfg.data.name == CORPORA[parts["corpus"]]
    optimizer = parts["optimizer"]
    if optimizer == "mars-m":
        assert (o.name, o.is_approx, o.memory_efficient) == ("mars-m", True, False)
    elif optimizer.startswith("mars"):
        assert (o.name, o.mars_type, o.is_approx) == ("mars", "mars-adamw", optimizer == "mars-approx")
    else:
        assert o.name == optimizer
    tokens = t.max_iters * t.global_batch_size * t.block_size
    budget = int(parts["billions"]) * 1e9
    assert abs(tokens - budget) <= 0.02 * budget, f"{name} trains {tokens:.3g} tokens"
    assert cfg.wandb.run_name == name


def preset_expectation(name: str) -> dict[str, object]:
    """Every key of the preset ``name``: the authors' run it reproduces (tests/configs/authors_runs.py), with
    what the name changes, and our keys at the value every preset holds them."""
    parts = NAME.fullmatch(name)
    optimizer, corpus = parts["optimizer"], CORPORA[parts["corpus"]]
    run = "mars" if optimizer in ("mars-approx", "mars-exact") else optimizer
    expected = authors_settings(parts["size"], run, corpus)
    if optimizer == "mars-exact":
        expected["optimizer.is_approx"] = False  # their MARS run with --is_approx=False (MARS/train_mars.py:345)
    if parts["billions"] != "50":
        # Ours: separate runs whose schedule ends at the budget (their configs define only 100,000-step runs).
        expected["train.max_iters"] = int(parts["billions"]) * 2000
    expected |= {key: value for key, (value, _) in OURS.items()} | OURS_BY_OPTIMIZER[run]
    expected["wandb.run_name"] = name
    expected["data.dir"] = str(data_root() / "fineweb-edu-sample-100BT") if corpus == "fineweb-edu" else None
    return expected


def drift(name: str, *overrides: str) -> dict[str, tuple]:
    """{key: (the preset's value, the expected one)} for every key where the composed preset and
    ``preset_expectation`` differ, a key either lacks included."""
    cfg = OmegaConf.to_container(load(f"experiment={name}", *overrides), resolve=True, enum_to_str=True)
    if cfg["data"]["dir"] is not None:
        cfg["data"]["dir"] = str(Path(cfg["data"]["dir"]).expanduser())
    actual, expected = flat_items(cfg), preset_expectation(name)
    missing = "(no such key)"
    return {key: (actual.get(key, missing), expected.get(key, missing)) for key in actual.keys() | expected.keys()
            if actual.get(key, missing) != expected.get(key, missing)}


@pytest.mark.parametrize("name", PRESETS)
def test_every_key_of_a_preset_is_the_authors_run_or_ours_by_design(name):
    assert drift(name) == {}


@pytest.mark.parametrize("override, key", [
    ("train.eval_iters=100", "train.eval_iters"), ("train.eval_interval=2000", "train.eval_interval"),
    ("train.eval_sampling=fixed", "train.eval_sampling"), ("train.compile=false", "train.compile"),
    ("optimizer.optimize_1d=true", "optimizer.optimize_1d"), ("optimizer.betas_1d=[0.9,0.99]", "optimizer.betas_1d"),
    ("optimizer.eps=1e-6", "optimizer.eps"), ("train.keep_checkpoints=3", "train.keep_checkpoints"),
    ("data.draws=keyed", "data.draws"),
])
def test_a_mars_preset_that_drifts_on_any_key_is_caught(override, key):
    assert drift("owt-gpt2-small-50b-mars-approx", override).keys() == {key}


@pytest.mark.parametrize("override, key", [
    ("optimizer.momentum=0.9", "optimizer.momentum"), ("optimizer.ns_steps=6", "optimizer.ns_steps"),
    ("optimizer.adamw_betas=[0.9,0.99]", "optimizer.adamw_betas"), ("optimizer.adamw_eps=1e-6", "optimizer.adamw_eps"),
])
def test_a_muon_preset_that_drifts_on_any_key_is_caught(override, key):
    assert drift("owt-gpt2-large-20b-muon", override).keys() == {key}


def test_the_transcription_covers_every_published_run_and_each_preset_reproduces_one():
    assert len(RUNS) == 19  # AdamW and MARS at 4 sizes, Muon at 3, MARS-M and Moonlight at 4
    reproduced = {(NAME.fullmatch(name)["size"], NAME.fullmatch(name)["optimizer"]) for name in PRESETS}
    assert {(size, "mars" if o in ("mars-approx", "mars-exact") else o) for size, o in reproduced} <= RUNS.keys()


def test_fineweb_presets_read_the_100b_sample_where_data_prepare_writes_it():
    cfg = load("experiment=fwe-gpt2-xl-50b-mars-approx")
    assert Path(cfg.data.dir).expanduser() == data_root() / "fineweb-edu-sample-100BT"


def test_command_line_overrides_apply_on_top_of_a_preset():
    cfg = load("experiment=owt-gpt2-small-5b-mars-approx", "optimizer.gamma=0.01", "train.global_batch_size=240")
    assert (cfg.optimizer.gamma, cfg.train.global_batch_size, cfg.optimizer.lr) == (0.01, 240, 6e-3)


@pytest.mark.parametrize("gpus, accumulation", [(1, 32), (2, 16), (4, 8), (8, 4), (32, 1)])
def test_a_preset_keeps_its_global_batch_on_any_gpu_count(gpus, accumulation):
    t = load("experiment=owt-gpt2-small-5b-adamw").train
    assert grad_accum_steps_for(t, gpus) == accumulation
    assert t.batch_size * gpus * accumulation == 480


def test_a_gpu_count_that_cannot_make_the_global_batch_is_refused_naming_the_numbers():
    with pytest.raises(ConfigError, match=r"global_batch_size \(480\) is not a multiple of .*15.* x 3 process"):
        grad_accum_steps_for(load("experiment=owt-gpt2-small-5b-adamw").train, 3)
    t = load("experiment=owt-gpt2-small-5b-adamw", "train.grad_accum_steps=2").train
    with pytest.raises(ConfigError, match="contradicts"):
        grad_accum_steps_for(t, 8)
