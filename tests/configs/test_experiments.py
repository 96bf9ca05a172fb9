"""The paper's runs as presets (configs/experiment/): each composes, validates, and trains the model with the
optimizer, on the corpus and for the token budget that its name states, with the authors' hyperparameters."""
import functools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from configs.schema import ConfigError, grad_accum_steps_for, register_configs, validate
from data.corpora import data_root

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
PRESETS = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml"))
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


@pytest.mark.parametrize("name", PRESETS)
def test_preset_keeps_the_authors_fixed_settings(name):
    cfg = load(f"experiment={name}")
    m, t = cfg.model, cfg.train
    assert (m.bias, m.dropout, m.block_size, t.block_size) == (False, 0.0, 1024, 1024)
    if cfg.optimizer.name in ("adamw", "mars", "muon"):  # MARS-M and Moonlight decay every tensor, as theirs
        assert cfg.optimizer.decay_embeddings is False
    # Their model's tanh GELU (MARS/model.py:20-25) and TF32 (MARS/train_mars.py:127-128).
    assert (m.activation, m.scale_attn_by_inverse_layer_idx, t.tf32) == ("gelu_tanh", True, True)
    assert (t.lr_schedule.value, t.warmup_iters, t.decay_iters, t.grad_clip) == ("cosine", 2000, None, 1.0)
    # 480 sequences of 1024 tokens per step: 491,520 tokens, as in the authors' scripts on 8 GPUs.
    assert t.global_batch_size == 480
    # Their OpenWebText batches: windows anywhere in train.bin (MARS/train_mars.py); FineWeb-Edu: one shard per
    # micro-batch, picked uniformly (MARS/train_mars_fw.py:141-149, MARS_M/train_mars_m_fw.py:141 alike).
    assert cfg.data.sampling.value == ("random_shard" if name.startswith("fwe") else "random")
    # Their initial weights: torch.manual_seed(5000 + rank) on every rank, rank 0's broadcast by DDP
    # (MARS/train_mars.py:126, MARS_M/train_mars_m.py:124); our model draws in their order from train.seed.
    assert t.seed == 5000


# The authors' config/train_gpt2_<size>_<optimizer>.py and their README's hyperparameter table.
AUTHORS = {
    ("small", "adamw"): dict(lr=6e-4, weight_decay=0.1, betas=[0.9, 0.95], min_lr=3e-5, batch=(15, 4)),
    ("medium", "adamw"): dict(lr=3e-4, weight_decay=0.1, betas=[0.9, 0.95], min_lr=6e-5, batch=(15, 4)),
    ("large", "adamw"): dict(lr=2e-4, weight_decay=0.1, betas=[0.9, 0.95], min_lr=1e-5, batch=(5, 12)),
    ("xl", "adamw"): dict(lr=2e-4, weight_decay=0.1, betas=[0.9, 0.95], min_lr=1e-5, batch=(5, 12)),
    ("small", "muon"): dict(lr=2e-2, weight_decay=0.0, adamw_lr=3e-3, adamw_weight_decay=0.1, min_lr=3e-5,
                            batch=(15, 4)),
    ("medium", "muon"): dict(lr=1e-2, weight_decay=0.0, adamw_lr=1.5e-3, adamw_weight_decay=0.1, min_lr=6e-5,
                             batch=(15, 4)),
    ("large", "muon"): dict(lr=6.67e-3, weight_decay=0.0, adamw_lr=1e-3, adamw_weight_decay=0.1, min_lr=1e-5,
                            batch=(5, 12)),
    ("small", "mars"): dict(lr=6e-3, weight_decay=1e-2, betas=[0.95, 0.99], gamma=0.025, lr_1d=3e-3,
                            weight_decay_1d=0.1, min_lr=3e-5, batch=(15, 4)),
    ("medium", "mars"): dict(lr=3e-3, weight_decay=1e-2, betas=[0.95, 0.99], gamma=0.025, lr_1d=1.5e-3,
                             weight_decay_1d=0.1, min_lr=6e-5, batch=(15, 4)),
    ("large", "mars"): dict(lr=2e-3, weight_decay=1e-2, betas=[0.95, 0.99], gamma=0.025, lr_1d=1e-3,
                            weight_decay_1d=0.1, min_lr=1e-5, batch=(5, 12)),
    ("xl", "mars"): dict(lr=2e-3, weight_decay=1e-2, betas=[0.95, 0.99], gamma=0.025, lr_1d=1e-3,
                         weight_decay_1d=0.1, min_lr=1e-5, batch=(5, 12)),
    # MARS_M/config/train_gpt2_<size>_{mars_m,moonlight}.py: learning_rate, weight_decay, beta1, min_lr, gamma;
    # the configs their scripts launch, where MARS_M/README.md:289-294 differs (README: MARS-M and Moonlight).
    ("small", "mars-m"): dict(lr=6e-3, weight_decay=1e-2, momentum=0.95, gamma=0.025, clip_c=True, min_lr=3e-5,
                              batch=(15, 4)),
    ("medium", "mars-m"): dict(lr=5e-3, weight_decay=1e-2, momentum=0.95, gamma=0.025, clip_c=True, min_lr=6e-5,
                               batch=(15, 4)),
    ("large", "mars-m"): dict(lr=5e-3, weight_decay=1e-2, momentum=0.95, gamma=0.025, clip_c=True, min_lr=1e-5,
                              batch=(5, 12)),
    ("xl", "mars-m"): dict(lr=3e-3, weight_decay=1e-2, momentum=0.95, gamma=0.025, clip_c=True, min_lr=1e-5,
                           batch=(5, 12)),
    ("small", "moonlight"): dict(lr=6e-3, weight_decay=0.1, momentum=0.95, nesterov=True, min_lr=3e-5,
                                 batch=(15, 4)),
    ("medium", "moonlight"): dict(lr=5e-3, weight_decay=0.1, momentum=0.95, nesterov=True, min_lr=6e-5,
                                  batch=(15, 4)),
    ("large", "moonlight"): dict(lr=5e-3, weight_decay=0.1, momentum=0.95, nesterov=True, min_lr=1e-5,
                                 batch=(5, 12)),
    ("xl", "moonlight"): dict(lr=3e-3, weight_decay=0.1, momentum=0.95, nesterov=True, min_lr=1e-5,
                              batch=(5, 12)),
}


@pytest.mark.parametrize("name", PRESETS)
def test_preset_uses_the_authors_hyperparameters(name):
    parts = NAME.fullmatch(name)
    optimizer = parts["optimizer"]
    expected = dict(AUTHORS[parts["size"], optimizer if optimizer in ("mars-m", "moonlight") else optimizer.split("-")[0]])
    cfg = load(f"experiment={name}")
    # Per-GPU batch and accumulation on the authors' 8 GPUs.
    batch_size, accumulation = expected.pop("batch")
    assert (cfg.train.batch_size, grad_accum_steps_for(cfg.train, world_size=8)) == (batch_size, accumulation)
    # Their loop sums the micro-batch gradients of each GPU without dividing (MARS/train_mars.py:378-391) and
    # DDP averages the GPUs: the optimizer sees their accumulation steps times the mean gradient.
    assert cfg.train.grad_multiplier == accumulation
    assert cfg.train.min_lr == expected.pop("min_lr")
    for key, value in expected.items():
        actual = cfg.optimizer[key]
        assert (list(actual) if key == "betas" else actual) == value, f"{name}: optimizer.{key}"


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
