"""The LLaMA-on-C4 presets (configs/experiment/c4-llama-*): each composes and holds GaLore's loop for its size, each
value against a transcription of their scripts and trainer (jiaweizzhao/GaLore at 2cc66f8), and the rates of
MARS and Muon that the presets take from the MARS paper's GPT-2 runs. Composition only: no corpus is read."""
import inspect
import math
import re

import numpy as np
import pytest
import torch

from configs.compose import validate
from configs.schema import EvalSampling, LrSchedule
from tests.configs.test_experiments import CONFIG_DIR, PRESETS as GPT2_PRESETS, load
from training.schedule import learning_rate

NAME = re.compile(r"c4-llama-(?P<size>60m|130m|350m|1b)-(?P<optimizer>adamw|mars-approx|muon)")
C4_PRESETS = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("c4-llama-*.yaml"))
# scripts/benchmark_c4/llama_<size>.sh: --num_training_steps (:10), --warmup_steps (:11), --batch_size (:8) and
# the GPUs of --nproc_per_node (:2); configs/llama_<size>.json: num_hidden_layers (:14), num_attention_heads
# (:13), hidden_size (:8), intermediate_size (:9).
GALORE = {
    "60m": dict(steps=10_000, warmup=1_000, micro_batch=256, gpus=1, shape=(8, 8, 512, 1376)),
    "130m": dict(steps=20_000, warmup=2_000, micro_batch=256, gpus=1, shape=(12, 12, 768, 2048)),
    "350m": dict(steps=60_000, warmup=6_000, micro_batch=128, gpus=4, shape=(24, 16, 1024, 2736)),
    "1b": dict(steps=100_000, warmup=10_000, micro_batch=16, gpus=8, shape=(24, 32, 2048, 5461)),
}
TOTAL_BATCH, MAX_LENGTH = 512, 256  # --total_batch_size 512 (.sh:9); --max_length's default (torchrun_main.py:42)
MIN_LR_RATIO, EVAL_EVERY = 0.1, 1000  # --min_lr_ratio's default (torchrun_main.py:46); --eval_every (.sh:14)
GPT2_WIDTHS = {"small": 768, "medium": 1024, "large": 1280, "xl": 1600}
MARS_PAPER_RUNS = {"mars-approx": ("small", "medium", "large", "xl"), "muon": ("small", "medium", "large")}


def galore_lr_factor(step: int, *, warmup: int, steps: int) -> float:
    """GaLore's cosine schedule as a factor of the peak lr at ``step`` (peft_pretraining/training_utils.py:128-143,
    cycle_length = num_training_steps as :59-60 set it). Their LambdaLR sets the factor of step 0 before the first
    update and steps it after each (torchrun_main.py:432-433), so update k (0-based) runs at the factor of k."""
    cycle_step = step % steps
    if cycle_step < warmup:
        if step != cycle_step and cycle_step < 2:
            return 1e-7
        return cycle_step / max(1, warmup)
    progress = (cycle_step - warmup) / max(1, steps - warmup)
    return MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))


def test_every_llama_size_has_a_preset_per_optimizer_and_every_preset_is_tested_by_one_module():
    assert C4_PRESETS == sorted(f"c4-llama-{size}-{optimizer}" for size in GALORE
                                for optimizer in ("adamw", "mars-approx", "muon"))
    every = sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml"))
    assert sorted(GPT2_PRESETS + C4_PRESETS) == every


@pytest.mark.parametrize("name", C4_PRESETS)
def test_preset_runs_galores_loop_for_its_size(name):
    parts = NAME.fullmatch(name)
    galore = GALORE[parts["size"]]
    cfg = load(f"experiment={name}")
    validate(cfg)  # the trainer takes it as it is
    m, t, o = cfg.model, cfg.train, cfg.optimizer
    assert (m.arch, m.n_layer, m.n_head, m.n_embd, m.intermediate_size) == ("llama", *galore["shape"])
    assert (cfg.data.name, t.block_size, t.global_batch_size) == ("c4", MAX_LENGTH, TOTAL_BATCH)
    assert (t.max_iters, t.warmup_iters) == (galore["steps"], galore["warmup"])
    assert t.warmup_iters * 10 == t.max_iters  # their warmup is a tenth of the steps
    # their micro-batch on their GPU count, whose accumulation then makes 512 sequences
    assert TOTAL_BATCH % (galore["micro_batch"] * galore["gpus"]) == 0 and t.batch_size == galore["micro_batch"]
    assert (t.lr_schedule, t.decay_iters) == (LrSchedule.cosine, None)
    assert t.min_lr == pytest.approx(MIN_LR_RATIO * o.lr, rel=1e-12)
    assert (t.grad_clip, t.grad_multiplier) == (0.0, 1.0)
    assert (t.eval_interval, t.eval_sampling) == (EVAL_EVERY, EvalSampling.whole)
    decays = [o[key] for key in ("weight_decay", "weight_decay_1d", "adamw_weight_decay") if key in o]
    assert decays and all(decay == 0.0 for decay in decays)
    assert cfg.wandb.run_name == name


@pytest.mark.parametrize("size", GALORE)
def test_our_schedule_gives_every_update_galores_learning_rate(size):
    t = load(f"experiment=c4-llama-{size}-adamw").train
    peak = load(f"experiment=c4-llama-{size}-adamw").optimizer.lr
    warmup, steps, min_lr, schedule = t.warmup_iters, t.max_iters, t.min_lr, t.lr_schedule  # plain values: fast
    ours = np.array([learning_rate(step, peak_lr=peak, min_lr=min_lr, warmup_iters=warmup, decay_iters=steps,
                                   schedule=schedule) for step in range(steps)])
    theirs = np.array([peak * galore_lr_factor(step, warmup=warmup, steps=steps) for step in range(steps)])
    differing = np.flatnonzero(~np.isclose(ours, theirs, rtol=1e-9, atol=1e-15))
    assert not differing.size, f"from step {differing[:1]}: ours {ours[differing[:3]]}, theirs {theirs[differing[:3]]}"


def test_the_schedule_check_fails_on_a_floor_that_is_not_a_tenth():
    t = load("experiment=c4-llama-60m-adamw", "train.min_lr=0.0").train
    last = learning_rate(t.max_iters - 1, peak_lr=1e-3, min_lr=t.min_lr, warmup_iters=t.warmup_iters,
                         decay_iters=t.max_iters, schedule=t.lr_schedule)
    assert last != pytest.approx(1e-3 * galore_lr_factor(t.max_iters - 1, warmup=t.warmup_iters, steps=t.max_iters))


@pytest.mark.parametrize("size", GALORE)
def test_the_adamw_baseline_is_torch_adams_default_update(size):
    o = load(f"experiment=c4-llama-{size}-adamw").optimizer
    adam = inspect.signature(torch.optim.Adam).parameters  # torchrun_main.py:293 sets only lr and weight_decay
    assert o.name == "adamw" and (tuple(o.betas), o.eps) == (adam["betas"].default, adam["eps"].default)
    assert o.weight_decay == 0.0 == adam["weight_decay"].default


def nearest_gpt2_size(width: int, sizes: tuple[str, ...]) -> str:
    return min(sizes, key=lambda size: abs(GPT2_WIDTHS[size] - width))


@pytest.mark.parametrize("name", [name for name in C4_PRESETS if not name.endswith("-adamw")])
def test_mars_and_muon_take_the_mars_papers_settings_for_the_gpt2_size_of_nearest_width(name):
    optimizer = NAME.fullmatch(name)["optimizer"]
    ours = load(f"experiment={name}")
    size = nearest_gpt2_size(ours.model.n_embd, MARS_PAPER_RUNS[optimizer])
    theirs = load(f"+paper=gpt2-{size}-{'mars' if optimizer == 'mars-approx' else 'muon'}").optimizer
    keys = (("lr", "lr_1d", "betas", "gamma", "is_approx", "optimize_1d", "betas_1d") if optimizer == "mars-approx"
            else ("lr", "adamw_lr", "momentum", "nesterov", "ns_steps", "adamw_betas"))
    assert {key: ours.optimizer[key] for key in keys} == {key: theirs[key] for key in keys}


def test_hellaswag_during_a_c4_run_is_refused_in_one_line():
    # HellaSwag is scored in GPT-2's tokens; a C4 model reads t5-base's
    cfg = load("experiment=c4-llama-60m-adamw", "train.hellaswag_interval=1000")
    with pytest.raises(ValueError, match=r"^train\.hellaswag_interval: HellaSwag is scored in GPT-2's tokens, and "
                                         r"data=c4's are t5-base's: set train\.hellaswag_interval=0"):
        validate(cfg)
