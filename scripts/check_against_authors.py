"""Our optimizers beside the MARS authors' own optimizer files, step by step, on the CPU or a GPU; and our GPT
beside theirs.

    python -m scripts.check_against_authors --authors-dir /path/to/AGI-Arena-MARS-checkout [--steps 40]
                                            [--only NAME ...] [--device cpu|cuda] [--output-dir results]

The authors' code (github.com/AGI-Arena/MARS) is imported from ``--authors-dir`` at run time; this repository holds
none of it. Each variant builds two optimizers over two copies of one toy GPT (their ``MARS/model.py``, every
weight random): ours as train.py builds it (``training.optimizers.build_optimizer`` from a GPT-2 small preset, with
``optimizer.ns_dtype=bfloat16``, what ``auto`` picks on CUDA), theirs as their trainers build it. Both get the same
gradients (a fixed function of parameter name and step, sized so that c_t is clipped on some steps and not on
others) and the same learning rate each step (warmup from 0, cosine to min_lr, then min_lr), and the parameters
are compared after every step. float32 parameters only: with bfloat16 ones their state is bfloat16 and ours
float32, by design.

torch.compile is disabled for the whole run, so their ``@torch.compile``'d Newton-Schulz functions run eagerly, as
ours do. ``--device cuda`` runs both sides on the GPU, and adds the variants on our Triton backend (the default of
MARS on CUDA; on the CPU they run only under ``TRITON_INTERPRET=1``). Prints a table (bitwise after ``--steps``
steps, first differing step, largest difference, and that difference relative to the largest change of any
parameter over the run) and writes it to ``<output-dir>/check_against_authors_<device>.{md,json}``, the JSON with
every step's figures.
"""
import argparse
import contextlib
import copy
import importlib
import importlib.util
import io
import os
import sys
import types
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

from configs.compose import compose_config
from configs.schema import LrSchedule
from mars import reference
from mars.group_steps import LIST_MARS_TYPES
from mars.optimizer import available_backends
from model import GPT, GPTConfig
from reporting import arguments
from reporting.bench_report import run_record, write_report
from training.optimizers import build_optimizer
from training.provenance import checkout_commit
from training.schedule import apply_schedule, learning_rate

# The files imported from --authors-dir, relative to their checkout.
AUTHORS_FILES = ("MARS/model.py", "MARS/opt.py", "MARS/optimizers/mars.py", "MARS/optimizers/adamw.py",
                 "MARS/optimizers/muon.py", "MARS_M/optimizers/mars_m.py", "MARS_M/optimizers/mars_m_efficient.py",
                 "MARS_M/optimizers/moonlight.py")
# Toy sizes for their GPTConfig (and ours, which has the same fields and parameter names): wte 40x24 (tied to
# lm_head, rows > cols), wpe 8x24 (rows < cols), square and rectangular block matrices, 1-D norms and biases.
TINY_GPT = dict(block_size=8, vocab_size=40, n_layer=1, n_head=2, n_embd=24, dropout=0.0, bias=True)
WARMUP_STEPS = 3
AUTHORS_MIN_LR = 3e-5  # min_lr of every GPT-2 small config of theirs (config/train_gpt2_small_mars.py:35, ...)
NS_DTYPE = "optimizer.ns_dtype=bfloat16"  # their Newton-Schulz is always bfloat16; ours on the CPU would be float32


# ------------------------------------------------------------------------------------------- the authors' code
@dataclass(frozen=True)
class AuthorsCode:
    """Their modules, imported from a checkout."""
    model: types.ModuleType  # MARS/model.py: GPT, and configure_optimizers which builds their MARS
    adamw: types.ModuleType  # MARS/optimizers/adamw.py
    muon: types.ModuleType  # MARS/optimizers/muon.py
    opt: types.ModuleType  # MARS/opt.py: CombinedOptimizer
    mars_m: types.ModuleType  # MARS_M/optimizers/mars_m.py
    mars_m_efficient: types.ModuleType
    moonlight: types.ModuleType


def check_authors_dir(authors_dir: Path) -> None:
    """Exit with a one-line message unless ``authors_dir`` holds every file this script imports."""
    if not authors_dir.is_dir():
        raise SystemExit(f"--authors-dir {authors_dir}: no such directory; give a checkout of AGI-Arena/MARS")
    for relative in AUTHORS_FILES:
        if not (authors_dir / relative).is_file():
            raise SystemExit(f"--authors-dir {authors_dir} does not look like a checkout of AGI-Arena/MARS: "
                             f"{relative} is missing")


def load_module(name: str, path: Path) -> types.ModuleType:
    """Import the file at ``path`` as module ``name`` (registered: their dataclasses look themselves up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class CpuTorch(types.ModuleType):
    """torch, but for ``zeros(..., device='cuda')``, which is made on the CPU: their Muon allocates its update buffer
    on CUDA whatever its parameters' device (muon.py:87). The one change to their code's behaviour."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*args, **kwargs):
        if kwargs.get("device") == "cuda":
            kwargs["device"] = "cpu"
        return torch.zeros(*args, **kwargs)


def load_authors_code(authors_dir: Path, device: torch.device = torch.device("cpu")) -> AuthorsCode:
    """Their optimizer files, model and CombinedOptimizer, imported from a checkout of AGI-Arena/MARS, for tensors
    on ``device``."""
    check_authors_dir(authors_dir)
    if "WORLD_SIZE" in os.environ:
        raise SystemExit("WORLD_SIZE is set: their Muon would all-reduce across ranks (muon.py:69); run this "
                         "script as one plain process")
    # MARS/model.py imports `from optimizers.mars import MARS`, their trainers running from MARS/; `optimizers`
    # (a folder without __init__.py) is made to name their folder whatever else the path holds.
    package = types.ModuleType("optimizers")
    package.__path__ = [str(authors_dir / "MARS" / "optimizers")]
    sys.modules["optimizers"] = package
    authors = AuthorsCode(
        model=load_module("authors_mars_model", authors_dir / "MARS" / "model.py"),
        adamw=importlib.import_module("optimizers.adamw"),
        muon=importlib.import_module("optimizers.muon"),
        opt=load_module("authors_mars_opt", authors_dir / "MARS" / "opt.py"),
        mars_m=load_module("authors_mars_m", authors_dir / "MARS_M" / "optimizers" / "mars_m.py"),
        mars_m_efficient=load_module("authors_mars_m_efficient",
                                     authors_dir / "MARS_M" / "optimizers" / "mars_m_efficient.py"),
        moonlight=load_module("authors_moonlight", authors_dir / "MARS_M" / "optimizers" / "moonlight.py"))
    if device.type == "cpu":
        authors.muon.torch = CpuTorch("torch")
    return authors


# ------------------------------------------------------------------------------------ one optimizer, stepped
@dataclass
class Side:
    """One optimizer over its own copy of the model, stepped as its trainer steps it."""
    model: nn.Module
    optimizer: torch.optim.Optimizer
    set_lr: Callable[[int], float]  # sets a step's learning rates as the side's trainer does; returns the lr
    stash_lookahead: Callable[[], None] | None = None  # the exact scheme's look-ahead call; None: approximate
    after_step: Callable[[], None] | None = None  # their exact scheme: update_last_grad, after zero_grad

    def take_step(self, step: int, gradients: dict[str, torch.Tensor], lookahead: dict[str, torch.Tensor]) -> float:
        """Step ``step`` with these gradients (and look-ahead gradients, for the exact scheme); returns the lr."""
        lr = self.set_lr(step)
        if self.stash_lookahead is not None:
            set_gradients(self.model, lookahead)
            self.stash_lookahead()
            self.optimizer.zero_grad(set_to_none=True)
        set_gradients(self.model, gradients)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.after_step is not None:
            self.after_step()
        return lr


def seeded_normal(shape: torch.Size, *key: object) -> torch.Tensor:
    """Standard normal values that depend on ``key`` alone (crc32: Python's own hash of a str varies by run)."""
    generator = torch.Generator().manual_seed(zlib.crc32("/".join(map(str, key)).encode()))
    return torch.randn(shape, generator=generator)


def tiny_model(gpt_class: type[nn.Module], config_class: type) -> nn.Module:
    """A toy GPT (``TINY_GPT``) with every weight drawn at random, so that weight decay and the like matter."""
    model = gpt_class(config_class(**TINY_GPT))
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(seeded_normal(param.shape, "weight", name) * 0.1)
    return model


def step_gradients(shapes: dict[str, torch.Size], step: int, kind: str) -> dict[str, torch.Tensor]:
    """The gradients of ``step`` (``kind``: "step", or "look-ahead" for the exact scheme), by parameter name.

    Their size cycles over 0.03, 0.06, 0.09 per element: the position embedding's c_t (8x24) has a norm below 1
    on some steps and above it (clipped) on others."""
    scale = 0.03 * (1 + step % 3)
    return {name: seeded_normal(shape, kind, name, step) * scale for name, shape in shapes.items()}


def set_gradients(model: nn.Module, gradients: dict[str, torch.Tensor]) -> None:
    for name, param in model.named_parameters():
        param.grad = gradients[name].to(param.device, copy=True)


def parameter_differences(ours: nn.Module, theirs: nn.Module) -> dict:
    """Whether the two models' parameters are bitwise equal, the largest absolute difference, and which differ."""
    their_params = dict(theirs.named_parameters())
    differences = {name: (param.double() - their_params[name].double()).abs().max().item()
                   for name, param in ours.named_parameters() if not torch.equal(param, their_params[name])}
    return {"bitwise": not differences, "max_abs_diff": max(differences.values(), default=0.0),
            "differing": sorted(differences)}


def compare_sides(ours: Side, theirs: Side, steps: int) -> list[dict]:
    """Step both sides ``steps`` times on the same gradients; per step, each side's lr, how far they are apart, and
    the largest change of any of our parameters since the start (what a difference is relative to)."""
    shapes = {name: param.shape for name, param in ours.model.named_parameters()}
    initial = {name: param.detach().clone() for name, param in ours.model.named_parameters()}
    rows = []
    for step in range(steps):
        gradients, lookahead = step_gradients(shapes, step, "step"), step_gradients(shapes, step, "look-ahead")
        our_lr = ours.take_step(step, gradients, lookahead)
        their_lr = theirs.take_step(step, gradients, lookahead)
        travelled = max((param.double() - initial[name].double()).abs().max().item()
                        for name, param in ours.model.named_parameters())
        rows.append({"step": step, "our_lr": our_lr, "their_lr": their_lr, "travelled": travelled,
                     **parameter_differences(ours.model, theirs.model)})
    return rows


def summarise(rows: list[dict]) -> dict:
    first = next((row for row in rows if not row["bitwise"]), None)
    return {"bitwise": first is None, "first_differing_step": None if first is None else first["step"],
            "first_differing_tensors": [] if first is None else first["differing"],
            "max_abs_diff": max(row["max_abs_diff"] for row in rows),
            "max_rel_diff": max(row["max_abs_diff"] / row["travelled"] if row["travelled"] else 0.0 for row in rows)}


def without_tensor_names(rows: list[dict]) -> list[dict]:
    """Per-step rows for the record: which tensors differ is kept for the first differing step only (summarise)."""
    return [{key: value for key, value in row.items() if key != "differing"} for row in rows]


# ------------------------------------------------------------------------------------------------ our side
def lr_window(steps: int) -> dict:
    """Warmup from 0 over ``WARMUP_STEPS`` as their trainers warm up, cosine down to min_lr two steps before the end,
    then min_lr: every branch of the schedule within a short run."""
    return dict(warmup_iters=WARMUP_STEPS, decay_iters=steps - 2)


def our_side(variant: "Variant", model: nn.Module, window: dict) -> Side:
    """Our optimizer for ``variant`` over ``model``, built and scheduled as train.py does (train.py:342-351)."""
    cfg = compose_config([f"experiment={variant.experiment}", NS_DTYPE, *variant.overrides])
    optimizer = build_optimizer(cfg.optimizer, model)
    if not variant.foreach:
        optimizer.foreach = False
    schedule = dict(min_lr=cfg.train.min_lr, schedule=cfg.train.lr_schedule, decay_fraction=cfg.train.decay_fraction,
                    **window)
    lookahead = optimizer.stash_lookahead_grad if getattr(optimizer, "needs_lookahead_grad", False) else None
    return Side(model, optimizer, lambda step: apply_schedule(optimizer, step, schedule, cfg.optimizer), lookahead)


# ---------------------------------------------------------------------------------------------- their side
def their_lr(step: int, peak_lr: float, window: dict) -> float:
    """Their get_lr (MARS/train_mars.py:251-266, the same in their other trainers), schedule='cosine': the same
    arithmetic as our learning_rate's cosine, called here because their trainers start training when imported."""
    return learning_rate(step, peak_lr=peak_lr, min_lr=AUTHORS_MIN_LR, schedule=LrSchedule.cosine, **window)


def set_group_lrs(optimizer: torch.optim.Optimizer, peak_lr: float, window: dict) -> Callable[[int], float]:
    """Their trainers' lr update: the scheduled lr written into every param group (train_mars.py:289-291,
    MARS_M/train_mars_m.py:298-300, train_moonlight.py:288-290)."""
    def set_lr(step: int) -> float:
        lr = their_lr(step, peak_lr, window)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
    return set_lr


def exact_scheme_calls(optimizer, is_approx: bool) -> dict:
    """Their exact scheme's calls around a step: update_previous_grad on the look-ahead gradient, update_last_grad
    after zero_grad (MARS/train_mars.py:372, 405; MARS_M/train_mars_m.py:381, 414)."""
    if is_approx:
        return {}
    return dict(stash_lookahead=optimizer.update_previous_grad, after_step=optimizer.update_last_grad)


def their_mars(authors: AuthorsCode, model: nn.Module, window: dict, *, mars_type: str, is_approx: bool,
               amsgrad: bool = False) -> Side:
    """MARS as MARS/train_mars.py:214-217 builds it (model.configure_optimizers), with the values of their
    config/train_gpt2_small_mars.py:26-40 and train_mars.py:68-74."""
    settings = {"gamma": 0.025, "is_approx": is_approx, "mars_type": mars_type, "optimize_1d": False,
                "lr_1d": 3e-3, "betas_1d": (0.9, 0.95), "weight_decay_1d": 0.1}
    if amsgrad:  # an argument of their MARS that no trainer of theirs sets
        settings["amsgrad"] = True
    peak_lr = 6e-3
    device_type = next(model.parameters()).device.type
    optimizer = model.configure_optimizers("mars", 1e-2, peak_lr, (0.95, 0.99), device_type, settings)
    return Side(model, optimizer, set_group_lrs(optimizer, peak_lr, window), **exact_scheme_calls(optimizer, is_approx))


def their_muon(authors: AuthorsCode, model: nn.Module, window: dict) -> Side:
    """Muon on the matrices, their AdamW on the rest, as MARS/train_muon.py:209-217 builds it, with the values of
    config/train_gpt2_small_muon.py:26-31; each part scheduled from its own peak lr (train_muon.py:290-293)."""
    optimizer = authors.opt.CombinedOptimizer(
        list(model.parameters()), [authors.adamw.AdamW, authors.muon.Muon],
        [{"lr": 3e-3, "betas": (0.9, 0.95), "weight_decay": 0.1}, {"lr": 2e-2, "weight_decay": 0.0}])

    def set_lr(step: int) -> float:
        for part, peak_lr in zip(optimizer.optimizers, optimizer.base_lrs):
            lr = their_lr(step, peak_lr, window)
            for group in part.param_groups:
                group["lr"] = lr
        return lr  # Muon's, the second part
    return Side(model, optimizer, set_lr)


def their_matrix_split(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """MARS_M/train_mars_m.py:212-219 (train_moonlight.py:208-215): tensors of two or more dimensions whose names
    mention no embedding or head take the matrix rule, the rest AdamW."""
    embedding_names = ("embed_tokens", "lm_head", "wpe", "wte")
    named = list(model.named_parameters())
    matrices = [p for name, p in named if p.ndim >= 2 and not any(part in name for part in embedding_names)]
    others = [p for name, p in named if p.ndim < 2 or any(part in name for part in embedding_names)]
    return matrices, others


def their_mars_m(authors: AuthorsCode, model: nn.Module, window: dict, *, is_approx: bool) -> Side:
    """MARS-M as MARS_M/train_mars_m.py:220-222 builds it (clip_c=False as that trainer, momentum = beta1,
    adamw_betas = betas_1d of train_mars_m.py:72), values of MARS_M/config/train_gpt2_small_mars_m.py:26-40."""
    matrices, others = their_matrix_split(model)
    optimizer = authors.mars_m.MARS_M(lr=6e-3, wd=1e-2, muon_params=matrices, adamw_params=others,
                                      is_approx=is_approx, gamma=0.025, clip_c=False, momentum=0.95,
                                      adamw_betas=(0.9, 0.95))
    return Side(model, optimizer, set_group_lrs(optimizer, 6e-3, window), **exact_scheme_calls(optimizer, is_approx))


def their_mars_m_efficient(authors: AuthorsCode, model: nn.Module, window: dict) -> Side:
    """MARS_M_Efficient, which no trainer of theirs builds, with the arguments train_mars_m.py gives MARS_M."""
    matrices, others = their_matrix_split(model)
    optimizer = authors.mars_m_efficient.MARS_M_Efficient(lr=6e-3, wd=1e-2, muon_params=matrices, adamw_params=others,
                                                          gamma=0.025, momentum=0.95, adamw_betas=(0.9, 0.95))
    return Side(model, optimizer, set_group_lrs(optimizer, 6e-3, window))


def their_moonlight(authors: AuthorsCode, model: nn.Module, window: dict) -> Side:
    """Moonlight as MARS_M/train_moonlight.py:216-218 builds it, values of
    MARS_M/config/train_gpt2_small_moonlight.py:26-28 and train_moonlight.py:68."""
    matrices, others = their_matrix_split(model)
    optimizer = authors.moonlight.Moonlight(lr=6e-3, wd=0.1, muon_params=matrices, adamw_params=others,
                                            momentum=0.95, adamw_betas=(0.9, 0.95))
    return Side(model, optimizer, set_group_lrs(optimizer, 6e-3, window))


# ------------------------------------------------------------------------------------------------- the model
# The presets' model options (configs/paper/common.yaml) at toy depth and width, with GPT-2's padded vocabulary.
MODEL_CHECK = dict(block_size=64, vocab_size=50304, n_layer=2, n_head=4, n_embd=64, dropout=0.0, bias=False,
                   scale_attn_by_inverse_layer_idx=True)
PRESET_SEED = 5000  # the presets' train.seed: their rank 0's torch.manual_seed(5000 + 0) (MARS/train_mars.py:126)


def compare_models(authors: AuthorsCode) -> dict:
    """Their GPT and ours, each built right after ``torch.manual_seed(PRESET_SEED)``: which initial weights differ,
    and the float32 losses of one batch (their attention softmax is written out, ours is SDPA: rounding apart)."""
    torch.manual_seed(PRESET_SEED)
    with contextlib.redirect_stdout(io.StringIO()):  # their constructor prints the parameter count
        theirs = authors.model.GPT(authors.model.GPTConfig(**MODEL_CHECK))
    torch.manual_seed(PRESET_SEED)
    ours = GPT(GPTConfig(**MODEL_CHECK, activation="gelu_tanh"))
    their_params = dict(theirs.named_parameters())
    differing = sorted(name for name, param in ours.named_parameters()
                       if name not in their_params or not torch.equal(param, their_params[name]))
    tokens = torch.randint(0, 50257, (2, MODEL_CHECK["block_size"] + 1),
                           generator=torch.Generator().manual_seed(PRESET_SEED))
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    with torch.no_grad():
        our_loss = ours(inputs, targets)[1].item()
        their_loss = theirs(inputs, targets)[1].item()
    return {"initial_weights_equal": not differing, "differing_weights": differing, "our_loss": our_loss,
            "their_loss": their_loss, "loss_abs_diff": abs(our_loss - their_loss)}


def model_paragraph(model: dict) -> str:
    equal = "equal, tensor for tensor" if model["initial_weights_equal"] else \
        f"NOT equal: {', '.join(model['differing_weights'])}"
    shape = (f"{MODEL_CHECK['n_layer']} layers, {MODEL_CHECK['n_head']} heads, width {MODEL_CHECK['n_embd']}, "
             f"vocabulary {MODEL_CHECK['vocab_size']:,}, the presets' options, tanh GELU")
    return (f"Model: their GPT and ours ({shape}), each built after torch.manual_seed({PRESET_SEED}): "
            f"initial weights {equal}; float32 loss of one batch {model['their_loss']:.6f} (theirs) and "
            f"{model['our_loss']:.6f} (ours), {format_difference(model['loss_abs_diff'])} apart.")


# ---------------------------------------------------------------------------------------------- the variants
@dataclass(frozen=True)
class Variant:
    name: str
    experiment: str  # our preset (configs/experiment/), with NS_DTYPE and ``overrides``
    overrides: tuple[str, ...]
    build_theirs: Callable[[AuthorsCode, nn.Module, dict], Side]
    foreach: bool = True  # False: our per-tensor path of Muon, MARS-M and Moonlight


def mars_variants() -> list[Variant]:
    """MARS-AdamW, -Lion and -Shampoo, approximate and exact, on our reference backend and on the torch one (the
    CPU default); MARS-AdamW and -Lion also on the Triton one (the CUDA default); and amsgrad on the reference
    backend."""
    variants = []
    for mars_type in reference.MARS_TYPES:
        for scheme in ("approx", "exact"):
            for backend in ("reference", "torch") + (("triton",) if mars_type in LIST_MARS_TYPES else ()):
                variants.append(Variant(
                    f"{mars_type}-{scheme}-{backend}", f"owt-gpt2-small-50b-mars-{scheme}",
                    (f"optimizer.mars_type={mars_type}", f"optimizer.backend={backend}"),
                    partial(their_mars, mars_type=mars_type, is_approx=scheme == "approx")))
    variants.append(Variant("mars-adamw-approx-amsgrad-reference", "owt-gpt2-small-50b-mars-approx",
                            ("optimizer.amsgrad=true", "optimizer.backend=reference"),
                            partial(their_mars, mars_type="mars-adamw", is_approx=True, amsgrad=True)))
    return variants


def matrix_variants() -> list[Variant]:
    """Muon, MARS-M (approximate, exact, memory-efficient) and Moonlight, each on our foreach and per-tensor paths."""
    kinds = [("muon", "owt-gpt2-small-50b-muon", (), their_muon),
             ("mars-m-approx", "owt-gpt2-small-50b-mars-m", (), partial(their_mars_m, is_approx=True)),
             ("mars-m-exact", "owt-gpt2-small-50b-mars-m", ("optimizer.is_approx=false",),
              partial(their_mars_m, is_approx=False)),
             ("mars-m-efficient", "owt-gpt2-small-50b-mars-m", ("optimizer.memory_efficient=true",),
              their_mars_m_efficient),
             ("moonlight", "owt-gpt2-small-50b-moonlight", (), their_moonlight)]
    return [Variant(name + ("" if foreach else "-per-tensor"), experiment, overrides, build, foreach)
            for name, experiment, overrides, build in kinds for foreach in (True, False)]


VARIANTS = mars_variants() + matrix_variants()


def runs_on(variant: Variant, device: torch.device) -> bool:
    """Whether our side of ``variant`` can run on ``device`` here (the Triton backend: CUDA, or TRITON_INTERPRET=1)."""
    backend = next((o.split("=", 1)[1] for o in variant.overrides if o.startswith("optimizer.backend=")), "auto")
    return backend == "auto" or backend in available_backends(device)


def run_variant(variant: Variant, authors: AuthorsCode, steps: int,
                device: torch.device = torch.device("cpu")) -> list[dict]:
    """Our optimizer and theirs for ``variant``, on ``device``, compared after each of ``steps`` steps."""
    window = lr_window(steps)
    with contextlib.redirect_stdout(io.StringIO()):  # their constructors print parameter counts
        base = tiny_model(authors.model.GPT, authors.model.GPTConfig).to(device)
        theirs = variant.build_theirs(authors, copy.deepcopy(base), window)
    ours = our_side(variant, copy.deepcopy(base), window)
    return compare_sides(ours, theirs, steps)


# ------------------------------------------------------------------------------------------------ the report
def format_difference(difference: float) -> str:
    return f"{difference:.1e}" if difference else "0"


def markdown_table(summaries: dict[str, dict], steps: int) -> str:
    lines = [f"| variant | bitwise after {steps} steps | first differing step | max abs diff | relative |",
             "|---|---|---:|---:|---:|"]
    for name, summary in summaries.items():
        first = summary["first_differing_step"]
        lines.append(f"| {name} | {'yes' if summary['bitwise'] else 'no'} | {'-' if first is None else first} "
                     f"| {format_difference(summary['max_abs_diff'])} "
                     f"| {format_difference(summary['max_rel_diff'])} |")
    return "\n".join(lines)


def setup_notes(authors_dir: Path, commit: str | None, device: torch.device) -> str:
    """What the table is of: the authors' checkout, the device, the compile switch, our presets' settings, the step
    numbers."""
    checkout = f"commit {commit}" if commit else "not a git work tree"
    return (f"Authors' code imported from `{authors_dir}` ({checkout}), both sides on {device.type}. relative: the "
            f"max abs diff over the largest change of any parameter since the start. torch.compile disabled: their "
            f"`@torch.compile`'d Newton-Schulz functions run eagerly. Ours: build_optimizer on the GPT-2 small "
            f"presets with `{NS_DTYPE}` (auto's choice on CUDA); MARS backend `torch` is our CPU default. float32 "
            f"parameters of a toy GPT, the same gradients and learning rates on both sides; steps counted from 0 "
            f"as in train.py (lr 0 at step 0).")


def main(argv: list[str] | None = None) -> None:
    parser = arguments.OneLineParser(prog="python -m scripts.check_against_authors", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-dir", type=Path, required=True, help="a checkout of github.com/AGI-Arena/MARS")
    parser.add_argument("--steps", type=int, default=40, help="steps per variant, compared after each")
    parser.add_argument("--only", nargs="+", choices=[variant.name for variant in VARIANTS], metavar="NAME",
                        help="these variants only, in this order (default: all)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where both sides run; cuda adds the variants on our Triton backend")
    parser.add_argument("--output-dir", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; run on a GPU machine or use --device cpu")
    if args.steps < WARMUP_STEPS + 3:
        parser.error(f"argument --steps: must be at least {WARMUP_STEPS + 3}, not {args.steps}: warmup, cosine decay "
                     "and min_lr each get steps")
    variants = ([next(v for v in VARIANTS if v.name == name) for name in args.only] if args.only
                else [variant for variant in VARIANTS if runs_on(variant, device)])
    unable = [variant.name for variant in variants if not runs_on(variant, device)]
    if unable:
        parser.error(f"{', '.join(unable)} need Triton on {device.type}: use --device cuda, or TRITON_INTERPRET=1")
    torch.set_num_threads(1)  # the same reductions every run, whatever the machine's cores
    with torch._dynamo.config.patch(disable=True), warnings.catch_warnings():
        # their mars.py:38 calls add(Number, Tensor), an overload torch warns is deprecated
        warnings.filterwarnings("ignore", message="This overload of add is deprecated", category=UserWarning)
        authors = load_authors_code(args.authors_dir, device)
        per_step = {variant.name: run_variant(variant, authors, args.steps, device) for variant in variants}
        model = compare_models(authors)
    summaries = {name: summarise(rows) for name, rows in per_step.items()}
    commit = checkout_commit(args.authors_dir)
    record = run_record("check_against_authors", argv, device, steps=args.steps,
                        authors_dir=str(args.authors_dir), authors_commit=commit, torch_compile="disabled",
                        ns_dtype="bfloat16", model=model, summaries=summaries,
                        per_step={name: without_tensor_names(rows) for name, rows in per_step.items()})
    write_report(args.output_dir, f"check_against_authors_{device.type}", "Our optimizers beside the MARS authors' "
                 "files", record, "\n\n".join([setup_notes(args.authors_dir, commit, device), model_paragraph(model),
                                        markdown_table(summaries, args.steps)]))


if __name__ == "__main__":
    main()
