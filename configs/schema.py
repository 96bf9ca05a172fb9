"""The typed schema behind the Hydra YAML in this folder.

Hydra merges every YAML file into these dataclasses, so an unknown key or a value of the wrong type stops the
run at start with a message naming the key. Checks that need more than a type (ranges, cross-field rules)
live in ``configs.compose.validate``, which also knows every optimizer's row (configs/registry.py).
"""
import difflib
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Optional

from omegaconf import MISSING, OmegaConf


class LrSchedule(str, Enum):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"
    wsd = "wsd"  # warmup-stable-decay: flat at the peak, then a linear cooldown over the last decay_fraction


class Precision(str, Enum):
    auto = "auto"  # bfloat16 autocast on CUDA, float32 on CPU
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class Sampling(str, Enum):
    random = "random"  # nanoGPT and the official MARS trainer: windows at uniformly random offsets
    sequential = "sequential"  # llm.c: contiguous non-overlapping windows in order, disjoint across ranks
    # The official FineWeb-Edu trainer: each micro-batch from one shard picked uniformly, windows at uniformly
    # random offsets inside it (never across a shard boundary)
    random_shard = "random_shard"


class Draws(str, Enum):
    # Each batch from a numpy generator keyed by its split, step, micro-batch and rank: any resume, any number of
    # processes, the same windows
    keyed = "keyed"
    # Every window (training, evaluation) as the MARS authors' trainers draw them: torch's generator seeded
    # train.seed + rank, continuing after the model's initialisation, in their order (data/authors_draws.py)
    authors = "authors"


class EvalSampling(str, Enum):
    fixed = "fixed"  # the same windows at every evaluation: comparable curves, one draw of sampling noise
    # New windows at every evaluation (the MARS authors' trainer): each evaluation's windows keyed by its step
    # (data.draws=authors: theirs), so the best of many evaluations is the minimum of independent noisy estimates,
    # which we assume the paper's table reports (docs/paper.md)
    fresh = "fresh"
    # Every row of the validation split once, the loss the mean over every scored target token (a corpus of rows,
    # C4: GaLore's evaluation, torchrun_main.py:84-126); its perplexity, exp of that loss, is val/perplexity
    whole = "whole"


class FinishedCheckpoints(str, Enum):
    all = "all"  # keep train.keep_checkpoints of them
    last = "last"  # the final one: enough to evaluate, export or train on
    none = "none"  # a finished sweep point keeps only its logs (a resume knows it finished)


class WandbMode(str, Enum):
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class ModelConfig:
    """The keys of every architecture (model/__init__.py): each model reads its own, and refuses another's set."""

    arch: str = "gpt2"  # gpt2 (model/gpt.py) or llama (model/llama.py)
    n_layer: int = MISSING
    n_head: int = MISSING
    n_embd: int = MISSING
    block_size: int = 1024  # context length: GPT-2's position-embedding table, LLaMA's rotary table
    vocab_size: int = 50304
    # GPT-2's
    bias: bool = False
    dropout: float = 0.0
    scale_attn_by_inverse_layer_idx: bool = False  # the MARS authors' runs: true
    activation: str = "gelu"  # gelu (exact) or gelu_tanh (GPT-2's tanh approximation; the MARS authors' runs)
    # LLaMA's
    intermediate_size: int = 2048  # the SwiGLU MLP's inner width
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_embeddings: bool = False  # lm_head shares the token embedding (GaLore's LLaMA: not)


@dataclass
class OptimizerConfig:
    name: str = MISSING
    lr: float = MISSING
    weight_decay: float = 0.0
    # nanoGPT decays every >=2-D weight; the MARS authors' trainer keeps the embeddings in the no-decay group.
    decay_embeddings: bool = True
    # Peak learning rates of other parts beside ``lr``, each scheduled as lr is, down to train.min_lr (not fields).
    part_lrs: ClassVar[tuple[str, ...]] = ()
    # Learning rates of other parts that the schedule keeps in proportion to lr (MARS's lr_1d, as the authors'
    # lr_1d_factor): each is its configured value times the scheduled lr / optimizer.lr (not fields).
    proportional_lrs: ClassVar[tuple[str, ...]] = ()
    # Whether its keys beyond its fields are its class's constructor arguments, which its row's check knows
    # (optimizer=external: ``+optimizer.betas=[0.9,0.99]``), rather than unknown keys (not a field).
    takes_class_arguments: ClassVar[bool] = False


@dataclass
class AdamWConfig(OptimizerConfig):
    name: str = "adamw"
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8


@dataclass
class MarsConfig(OptimizerConfig):
    """MARS with the authors' defaults (AGI-Arena/MARS); see mars.MARS for the meaning of each field."""

    name: str = "mars"
    proportional_lrs: ClassVar[tuple[str, ...]] = ("lr_1d",)
    mars_type: str = "mars-adamw"  # mars-adamw, mars-lion or mars-shampoo (checked by mars.MARS)
    betas: tuple[float, float] = (0.95, 0.99)
    eps: float = 1e-8
    gamma: float = 0.025
    is_approx: bool = True
    amsgrad: bool = False
    optimize_1d: bool = False
    lr_1d: float = 3e-3
    betas_1d: tuple[float, float] = (0.9, 0.95)
    weight_decay_1d: float = 0.1
    backend: str = "auto"  # auto (Triton on CUDA, foreach PyTorch on CPU), reference, torch or triton
    # mars-shampoo's Newton-Schulz: auto (the official bfloat16 on CUDA, float32 on CPUs, ~10x faster there),
    # bfloat16 or float32
    ns_dtype: str = "auto"
    ns_form: str = "products"  # mars-shampoo's Newton-Schulz product order: the authors' products, or fused_gram
    ns_cuda_graph: bool = False  # mars-shampoo's Newton-Schulz as one CUDA graph per step (CUDA only)
    ns_batch: bool = False  # mars-shampoo's same-shaped matrices as one batch of products (the authors': one by one)


@dataclass
class MuonConfig(OptimizerConfig):
    """Muon on 2-D weights and AdamW on the rest, as the MARS authors ran their Muon baseline."""

    name: str = "muon"
    part_lrs: ClassVar[tuple[str, ...]] = ("adamw_lr",)
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    adamw_lr: float = 3e-3
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    adamw_weight_decay: float = 0.1
    # auto: the authors' bfloat16 on CUDA, float32 on CPUs (~10x faster there, without bfloat16 matrix units).
    ns_dtype: str = "auto"
    adamw_variant: str = "authors"  # AdamW of the non-2-D tensors: the authors' (MARS optimizers/adamw.py) or torch
    update_dtype: str = "bfloat16"  # Muon's updates rounded to bfloat16 before they apply (the authors') or float32
    # Newton-Schulz's product order (mars.newton_schulz.NS_FORMS): the authors' products, gram or fused_gram
    ns_form: str = "products"
    ns_cuda_graph: bool = False  # Newton-Schulz as one CUDA graph per step (CUDA only): no launch per kernel
    ns_batch: bool = False  # same-shaped matrices orthogonalised as one batch (the authors': one by one)


@dataclass
class MarsMConfig(OptimizerConfig):
    """MARS-M (AGI-Arena/MARS MARS_M/optimizers/mars_m.py): MARS's correction on Moonlight-style orthogonalised
    updates of the 2-D weights (embeddings and head excepted), the authors' AdamW on the rest, one lr and one
    weight decay for both (every tensor decays, as theirs: ``decay_embeddings`` does not apply)."""

    name: str = "mars-m"
    momentum: float = 0.95
    gamma: float = 0.025
    is_approx: bool = True
    # The authors' code clips c_t to unit norm in every run (their clip_c flag is never read): true reproduces them.
    clip_c: bool = True
    memory_efficient: bool = False  # mars_m_efficient.py: one buffer, no clip, approximate scheme only
    ns_steps: int = 5
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    ns_dtype: str = "auto"  # auto: the authors' bfloat16 on CUDA, float32 on CPUs
    ns_form: str = "gram"  # Newton-Schulz's product order: the authors' gram, fused_gram or products
    ns_cuda_graph: bool = False  # Newton-Schulz as one CUDA graph per step (CUDA only): no launch per kernel
    ns_batch: bool = False  # same-shaped matrices orthogonalised as one batch (the authors': one by one)


@dataclass
class MoonlightConfig(OptimizerConfig):
    """Moonlight (MARS_M/optimizers/moonlight.py): Muon with the update scaled by 0.2 sqrt(max(A, B)) and decoupled
    weight decay on the 2-D weights, the authors' AdamW on the rest, one lr and one weight decay for both."""

    name: str = "moonlight"
    momentum: float = 0.95
    nesterov: bool = True
    ns_steps: int = 5
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    ns_dtype: str = "auto"
    ns_form: str = "gram"  # Newton-Schulz's product order: the authors' gram, fused_gram or products
    ns_cuda_graph: bool = False  # Newton-Schulz as one CUDA graph per step (CUDA only): no launch per kernel
    ns_batch: bool = False  # same-shaped matrices orthogonalised as one batch (the authors': one by one)


@dataclass
class DataConfig:
    name: str = MISSING
    # Directory of token shards (train.bin/val.bin, or train_000000.bin... with a manifest.json as written by
    # `python -m data.prepare`); null means the named corpus' default location (embedded: built on first use).
    dir: Optional[str] = None
    sampling: Sampling = Sampling.random
    draws: Draws = Draws.keyed  # keyed, or authors: the paper presets (needs train.eval_sampling=fresh)


@dataclass
class TrainConfig:
    batch_size: int = 8  # sequences per micro-batch
    block_size: int = 128  # tokens per sequence, at most model.block_size
    grad_accum_steps: int = 1
    # Sequences per optimizer step over all ranks. When set, grad_accum_steps is derived from it and the number
    # of processes, so a preset keeps its batch on 1, 8 or 64 GPUs.
    global_batch_size: Optional[int] = None
    max_iters: int = 100  # the default run: under 3 minutes on a 2-core CPU (README)
    eval_interval: int = 25
    eval_iters: int = 8
    # fixed, or fresh: the paper presets, which also score the fixed windows (logged as val/loss_fixed)
    eval_sampling: EvalSampling = EvalSampling.fixed
    log_interval: int = 10
    lr_schedule: LrSchedule = LrSchedule.cosine
    warmup_iters: int = 20
    decay_iters: Optional[int] = None  # where the decay reaches min_lr; null means max_iters
    decay_fraction: float = 0.2  # wsd only: share of the run spent cooling down
    min_lr: float = 1e-4
    grad_clip: float = 1.0  # 0 disables clipping
    # The optimizer (and the clip before it) receives grad_multiplier x the mean gradient over the global batch.
    # 1: the mean, as nanoGPT. The MARS authors' loop sums the micro-batch gradients of each rank without dividing
    # by the accumulation steps (AGI-Arena/MARS MARS/train_mars.py:378-391) and DDP averages over their 8 GPUs: 4x
    # the mean for GPT-2 small/medium (15 x 4 x 8), 12x for large/XL (5 x 12 x 8). A preset sets their factor,
    # which then holds on any number of GPUs and any accumulation.
    grad_multiplier: float = 1.0
    tf32: bool = False  # TF32 matmuls and cuDNN convolutions on CUDA, as the MARS authors' trainer (presets: true)
    dtype: Precision = Precision.auto
    compile: bool = False
    # torch.compile's mode when compile is true: default, reduce-overhead (CUDA graphs), max-autotune (Triton
    # matmul templates searched, CUDA graphs) or max-autotune-no-cudagraphs; the numerics stay the model's.
    compile_mode: str = "default"
    # Tokens per chunk of the head's chunked cross-entropy (model/loss.py): the loss and its gradients are
    # computed chunk by chunk and the full logits are never held. 0: the plain head and loss (the default).
    loss_chunk_size: int = 0
    seed: int = 1337
    device: str = "auto"  # auto, cpu, cuda, cuda:N
    checkpoint_interval: int = 250
    keep_checkpoints: int = 2
    finished_checkpoints: FinishedCheckpoints = FinishedCheckpoints.all  # what a run keeps once at max_iters
    resume: bool = False
    # A fresh start (resume=false) in a directory that holds another run's records (checkpoints, logs, wandb/)
    # deletes them instead of refusing to start; refused together with resume=true.
    overwrite: bool = False
    hellaswag_interval: int = 0  # steps between HellaSwag evaluations (and one at the end); 0: none
    hellaswag_file: Optional[str] = None  # null: the data cache's copy (python -m evaluation.hellaswag --download)
    hellaswag_items: Optional[int] = None  # evaluate the first N items only; null: all 10,042
    max_skipped_steps: int = 0  # steps with a NaN/inf loss or gradient to skip before stopping; 0 stops at once
    # A val loss above this x the step-0 one (the untrained model's) marks the run diverged; with
    # stop_on_diverged_val_loss it stops there, else it trains on and is marked diverged at its end. 1.1, not 1:
    # a run that has barely trained (a tiny lr, an early evaluation) scores fresh windows a little above step 0's.
    diverged_val_loss_ratio: float = 1.1
    stop_on_diverged_val_loss: bool = True
    zero1: bool = False  # shard the optimizer state across DDP ranks (ZeRO stage 1)
    # Seconds a rank waits for the others (to join the group, in each collective) before it fails and the job
    # ends, on c10d nodes whatever torchrun's --max-restarts: what a frozen node costs. Must outlast a checkpoint's
    # write.
    distributed_timeout_s: float = 600.0


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


@dataclass
class WandbConfig:
    mode: WandbMode = WandbMode.disabled
    project: str = "mars-gpt2"
    entity: Optional[str] = None
    run_name: Optional[str] = None  # null: derived from model, optimizer and data
    # Seconds the launch waits for the wandb server to start the run (wandb's init_timeout): a server that does not
    # answer fails the launch after about this long, the run directory left as it was.
    init_timeout_s: float = 60.0


@dataclass
class Config:
    model: ModelConfig = MISSING
    optimizer: Any = MISSING
    data: DataConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


class ConfigError(ValueError):
    """A config value out of range; the message names the key and the fix."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def unknown_key_message(section: str, key: str, known: list[str], where: str = "") -> str:
    """``unknown config key optimizer.gama<where>: did you mean optimizer.gamma? the keys of optimizer are ...``:
    the one line for a key of ``section`` that its schema (whose keys are ``known``) does not have."""
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"did you mean {section}.{close[0]}? " if close else ""
    return f"unknown config key {section}.{key}{where}: {hint}the keys of {section} are {', '.join(known)}"


def check_finite(cfg) -> None:
    """Refuse NaN and infinity in any number (``optimizer.lr=inf`` passes ``lr > 0`` and diverges at step 2)."""
    for section in ("model", "train", "optimizer"):
        for key, value in cfg[section].items():
            numbers = value if OmegaConf.is_list(value) else [value]
            require(all(not isinstance(x, float) or math.isfinite(x) for x in numbers),
                    f"{section}.{key}={value} is not a finite number: give it a finite value")


def check_optimizer_hyperparameters(o) -> None:
    """The ranges torch.optim's constructors check, by the names this harness's optimizers share: refused at start,
    naming the key, not by the constructor once the data has loaded. An optimizer's own keys: its row's ``check``."""
    for key, value in o.items():
        if key.endswith(("betas", "betas_1d")):
            require(len(value) == 2 and all(0.0 <= beta < 1.0 for beta in value),
                    f"optimizer.{key} must be a pair [beta1, beta2] with 0 <= beta < 1, got {list(value)}")
        elif key == "momentum":
            require(0.0 <= value < 1.0, f"optimizer.momentum must be in [0, 1), got {value}")
        elif key.endswith(("eps", "weight_decay", "weight_decay_1d", "gamma", "_lr")) or key.startswith("lr_"):
            require(value >= 0.0, f"optimizer.{key} must be >= 0, got {value}")


def check_model(m) -> None:
    """The model's own checks (sizes, heads, dropout, activation: model.GPTConfig's or model.LlamaConfig's, and
    no key of another architecture), as config errors."""
    from model import model_config  # with torch: imported when a run's config is validated, not with the schema

    try:
        model_config(OmegaConf.to_container(m))
    except ValueError as err:
        raise ConfigError(f"model.{err}") from None


def lr_decay_end(t) -> int:
    """The step at which the lr decay reaches train.min_lr: ``train.decay_iters``, or ``train.max_iters`` when null
    (``t``: the train section, as configured or as a checkpoint saved it)."""
    return t["max_iters"] if t.get("decay_iters") is None else t["decay_iters"]


def grad_accum_steps_for(t, world_size: int) -> int:
    """Micro-batches per step on each rank: ``train.grad_accum_steps``, or what ``train.global_batch_size`` needs."""
    if t.global_batch_size is None:
        return t.grad_accum_steps
    per_micro_step = t.batch_size * world_size
    require(t.global_batch_size % per_micro_step == 0,
            f"train.global_batch_size ({t.global_batch_size}) is not a multiple of train.batch_size "
            f"({t.batch_size}) x {world_size} process(es) = {per_micro_step}: change train.batch_size or the "
            "number of processes")
    derived = t.global_batch_size // per_micro_step
    require(t.grad_accum_steps in (1, derived),
            f"train.grad_accum_steps={t.grad_accum_steps} contradicts train.global_batch_size="
            f"{t.global_batch_size} (which needs {derived} on {world_size} process(es)): set only one of them")
    return derived
