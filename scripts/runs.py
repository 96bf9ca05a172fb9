"""Finished (or running) training runs read back from their directories, labelled as the paper labels them.

A run directory is what train.py writes: ``metrics.jsonl`` and ``.hydra/config.yaml``. Each run is labelled by
corpus, model size, optimizer and token budget; runs whose configs differ only in the seed (or in settings that
do not change the result: device, paths, logging, checkpointing, where a named corpus lies) and that read data of
the same size (train.py logs the tokens of each split at each launch) share a ``setting`` and count as seeds of
it; a run resumed with changed settings, seed or data (a ``changed`` record in its log, or other shards read) is
a setting of its own. A run whose last logged step is short of its ``max_iters`` (``Run.stopped_early``) stopped
or is still going: the table and the figures mark it.
A sweep point that was refused, diverged or failed holds ``failure.json`` (its kind, reason, last step and
overrides; a refused point may hold nothing else): it is a run too (``Run.failure``), never pooled with the
healthy seeds of its setting but a setting of its own (:func:`split_failed`). Two runs of one setting with the
same ``train.seed`` (a sweep and a re-run of it in another directory) are one run, not two seeds: the one that
trained furthest is kept, and the other is named as left out (:func:`one_run_per_seed`).
A run's best validation loss is that of its evaluations after step 0 (the step-0 one scores the untrained model);
besides it, its final one (``Run.final_val_loss``) shows a late blow-up, and its best within the first B tokens
(``Run.best_val_loss_within``) is what a shorter budget B reads off a longer run.
Used by ``scripts.make_table``, ``scripts.plot_curves`` and ``scripts.plot_sweep``.
"""
import argparse
import dataclasses
import glob
import itertools
import json
import logging
import math
import os
import statistics
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from configs.models import GPT2_SHAPES
from configs.schema import DataConfig, ModelConfig, TrainConfig, register_configs
from data.corpora import CUSTOM, EMBEDDED
from training.metrics import METRICS_FILE, read_metrics
from training.registry import OPTIMIZERS
from training.resume import flat_items
# What train.py writes into a run that was refused, diverged or failed otherwise: {kind, reason, step, overrides, time}.
from training.sweep import FAILURE_FILE

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
UNKNOWN = "unknown"  # the corpus, model and optimizer of a failed point whose overrides no longer compose
MODEL_SIZES = {shape: size for size, shape in GPT2_SHAPES.items()}
SIZE_ORDER = tuple(GPT2_SHAPES)
CORPUS_NAMES = {"openwebtext": "OpenWebText", "fineweb-edu": "FineWeb-Edu", "embedded": "Shakespeare (embedded)"}
# Each optimizer label's display name, in the tables' order.
OPTIMIZER_NAMES = {label: name for entry in OPTIMIZERS.values() for label, name in entry.labels.items()}
# The training settings that change what a run computes, or the figure the table reads off it (the best of
# evaluations every eval_interval steps, each over eval_iters batches, on fixed or fresh windows); the rest
# (seed, device, paths, logging) do not.
SETTING_KEYS = ("batch_size", "block_size", "grad_accum_steps", "max_iters", "lr_schedule", "warmup_iters",
                "decay_iters", "decay_fraction", "min_lr", "grad_clip", "grad_multiplier", "dtype", "tf32",
                "eval_interval", "eval_iters", "eval_sampling")


@dataclass
class Run:
    name: str  # the run directory, or the wandb run name
    corpus: str  # openwebtext, fineweb-edu, embedded, or else data.name and data.dir (custom:/data/shards)
    model: str  # small, medium, large, xl, or <layers>x<width> for other shapes
    optimizer: str  # adamw, muon, mars-approx, mars-exact (mars-lion-approx, ... for other MARS types)
    budget: float  # tokens the run is configured to train on
    setting: str  # what identifies the configuration up to the seed
    lr: float | None = None
    gamma: float | None = None
    records: list[dict] = field(default_factory=list)
    max_iters: int | None = None  # the steps it is configured for; None if unknown
    config: dict = field(default_factory=dict)  # the composed config as saved, when read from a run directory
    data: dict | None = None  # what its first launch read ({"train": {"tokens": ...}, "val": ...}); None if unlogged
    code: list[str] = field(default_factory=list)  # the code each launch ran (code_label); empty if unlogged
    failure: dict | None = None  # its failure.json: the run was refused, diverged or failed otherwise
    modified: float = 0.0  # when its directory's files last changed (seconds since the epoch)

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def failed_at(self) -> str:
        """``diverged at step 40``, ``refused``: how and where it failed."""
        kind = self.failure["kind"]
        return kind if kind == "refused" else f"{kind} at step {self.failure.get('step', 0):,}"

    @property
    def failure_note(self) -> str:
        """``diverged at step 40: the loss is nan``, ``refused: optimizer.lr must be positive, got -1.0``."""
        return f"{self.failed_at}: {self.failure['reason']}"

    @property
    def seed(self) -> int | None:
        return self.config.get("train", {}).get("seed")

    @property
    def evaluations(self) -> list[dict]:
        return [r for r in self.records if "val/loss" in r]

    @property
    def trained_evaluations(self) -> list[dict]:
        """The evaluations after step 0: the step-0 one scores the untrained model, the same for every optimizer,
        and is no run's best."""
        return [r for r in self.evaluations if r["step"] > 0]

    @property
    def best_val_loss(self) -> float | None:
        losses = [r["val/loss"] for r in self.trained_evaluations]
        return min(losses) if losses else None

    @property
    def final_val_loss(self) -> float | None:
        """The last evaluation's loss (after step 0): beside the best, it shows a late blow-up."""
        evaluations = self.trained_evaluations
        return evaluations[-1]["val/loss"] if evaluations else None

    @property
    def best_val_loss_fixed(self) -> float | None:
        """The best validation loss on the fixed windows: ``val/loss_fixed`` of a run evaluated on fresh windows
        (train.eval_sampling=fresh, the paper's procedure), ``val/loss`` of one evaluated on fixed windows; None
        for a run that logged no such figure."""
        fresh = self.config.get("train", {}).get("eval_sampling") == "fresh"
        losses = [r["val/loss_fixed"] if fresh else r["val/loss"] for r in self.trained_evaluations
                  if not fresh or "val/loss_fixed" in r]
        return min(losses) if losses else None

    @property
    def last_step(self) -> int:
        return max((r["step"] for r in self.records), default=0)

    @property
    def stopped_early(self) -> bool:
        """Whether the run logged no step as far as its max_iters: stopped (preempted, killed) or still going."""
        return self.max_iters is not None and self.last_step < self.max_iters

    @property
    def stopped_at(self) -> str:
        return f"at step {self.last_step:,} of {self.max_iters:,}"

    def prefix_steps(self, tokens: float) -> int | None:
        """The steps of the first ``tokens`` (a nominal budget, 5e9) of this run, as the presets count them.

        That is max_iters x tokens / the run's nominal budget: a preset trains for its nominal budget / 500,000
        steps of 491,520 tokens (10,000 for 5B, 40,000 for 20B, 100,000 for 50B), so the first 5B tokens of a 50B
        run end at step 10,000, where the 5B preset stops (4.92e9 tokens), and not at step 10,172 (5e9 tokens).
        For a run whose budget is not a round number, this is the last step with at most ``tokens`` tokens.
        None if max_iters is unknown.
        """
        if self.max_iters is None:
            return None
        return math.floor(self.max_iters * tokens / nominal_tokens(self.budget) + 1e-6)

    def best_val_loss_within(self, tokens: float) -> float | None:
        """The best validation loss evaluated within the first ``tokens`` of the run (see ``prefix_steps``).

        None until the run has logged a step at or past the end of those tokens: before that the figure is not
        yet the one for ``tokens``.
        """
        end = self.prefix_steps(tokens)
        if end is None or not any(record["step"] >= end for record in self.records):
            return None
        losses = [r["val/loss"] for r in self.trained_evaluations if r["step"] <= end]
        return min(losses) if losses else None


def training_seconds(run: Run, steps: np.ndarray) -> np.ndarray:
    """Cumulative training time at ``steps``, interpolated between the logged training records.

    That is the sum of the logged ``step_ms`` (each the mean step time of its log window): training steps only,
    without evaluations and checkpoints. train.py logs no wall-clock time.
    """
    logged = sorted((r["step"], r["step_ms"]) for r in run.records if "step_ms" in r)
    at, elapsed, previous = [0], [0.0], 0
    for step, step_ms in logged:
        elapsed.append(elapsed[-1] + step_ms / 1000 * (step - previous))
        at.append(step)
        previous = step
    return np.interp(steps, at, elapsed)


def where_stopped(runs: list[Run]) -> str:
    """``adamw-seed2 at step 1,200 of 10,000, ...``: runs by directory name and where they stopped."""
    return ", ".join(f"{Path(run.name).name} {run.stopped_at}" for run in runs)


def model_label(model_cfg) -> str:
    shape = (model_cfg["n_layer"], model_cfg["n_head"], model_cfg["n_embd"])
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


class UnreadableRun(ValueError):
    """A run directory whose saved config or failure record cannot be read; the message names the file."""


def read_failure(run_dir: Path) -> dict | None:
    """The run's failure.json, or None if it holds none."""
    path = run_dir / FAILURE_FILE
    if not path.is_file():
        return None
    try:
        failure = json.loads(path.read_bytes())
    except OSError as err:
        raise UnreadableRun(f"{path} cannot be read ({err.strerror})") from None
    except ValueError as err:  # undecodable bytes, or not JSON
        raise UnreadableRun(f"{path} is not JSON ({err})") from None
    missing = [key for key in ("kind", "reason", "overrides") if not isinstance(failure, dict) or key not in failure]
    if missing:
        raise UnreadableRun(f"{path} is not a failure record train.py wrote (no {', '.join(missing)})")
    return failure


def read_saved_config(path: Path) -> dict:
    """The config train.py saved in ``.hydra/config.yaml``, checked to hold the sections the labels come from."""
    try:
        cfg = OmegaConf.to_container(OmegaConf.load(path))
    except OSError as err:
        raise UnreadableRun(f"{path} cannot be read ({err.strerror})") from None
    except (yaml.YAMLError, ValueError, OmegaConfBaseException) as err:  # ValueError: undecodable bytes
        raise UnreadableRun(f"{path} is not YAML ({' '.join(str(err).split())})") from None
    if not cfg:
        raise UnreadableRun(f"{path} is empty")
    if not isinstance(cfg, dict):
        raise UnreadableRun(f"{path} holds a {type(cfg).__name__}, not the mapping of a saved config")
    lacking = [section for section in ("model", "optimizer", "data", "train") if not isinstance(cfg.get(section), dict)]
    if lacking:
        raise UnreadableRun(f"{path} has no {', '.join(lacking)} section: not a config train.py saved")
    return cfg


def composed_config(overrides: list[str]) -> dict | None:
    """The config that ``overrides`` compose today (what a point refused before Hydra saved one ran with), or
    None if they no longer compose."""
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return OmegaConf.to_container(compose(config_name="config", overrides=overrides), resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        log.warning("the overrides %s no longer compose (%s): the point is labelled %s", overrides, err, UNKNOWN)
        return None


def configured_tokens_per_step(train_cfg: dict) -> float:
    """Tokens per step as the config says on one process (train.global_batch_size counts every rank); a float, as
    the log's tokens / steps are, so that the settings of both kinds of run compare equal."""
    sequences = train_cfg.get("global_batch_size") or train_cfg["batch_size"] * train_cfg["grad_accum_steps"]
    return float(sequences * train_cfg["block_size"])


def load_run(run_dir: Path) -> Run:
    """The run in ``run_dir``: finished, stopped, failed (``failure.json``), or not past its first step yet."""
    failure = read_failure(run_dir)
    config_path = run_dir / ".hydra" / "config.yaml"
    cfg = read_saved_config(config_path) if config_path.is_file() else None
    if cfg is None:
        cfg = composed_config(failure["overrides"])
        if cfg is None:
            return unlabelled_failure(run_dir, failure)
    try:
        return labelled_run(run_dir, cfg, read_metrics(run_dir), failure)
    except OSError as err:
        raise UnreadableRun(f"{run_dir / METRICS_FILE} cannot be read ({err.strerror})") from None
    except (KeyError, TypeError, AttributeError) as err:  # a key missing, or a value of another type
        problem = f"lacks the key {err}" if isinstance(err, KeyError) else f"holds a value of the wrong type ({err})"
        raise UnreadableRun(f"{config_path} {problem}: not a config train.py saved") from None


def labelled_run(run_dir: Path, cfg: dict, records: list[dict], failure: dict | None) -> Run:
    """The run of ``run_dir`` labelled from its saved (or composed) config and its metrics log."""
    step = next((r for r in records if "train/loss" in r and r["step"] > 0), None)
    # Tokens per step come from the log, which counts every rank: the config alone does not know the world size.
    # A run that logged no training step (it failed or stopped before) has the config's on one process.
    tokens_per_step = step["tokens"] / step["step"] if step else configured_tokens_per_step(cfg["train"])
    budget = cfg["train"]["max_iters"] * tokens_per_step
    check_written_by_this_version(run_dir, cfg)
    corpus = corpus_of(cfg["data"])
    # The corpus stands for data.name and data.dir: its shard directory tells a custom corpus, not a named one.
    data_cfg = {**cfg["data"], "name": corpus}
    setting = {"model": cfg["model"],
               "optimizer": without_defaults(cfg["optimizer"]),
               "data": {key: value for key, value in data_cfg.items() if key != "dir"},
               "train": {key: cfg["train"][key] for key in SETTING_KEYS},
               "tokens_per_step": tokens_per_step}
    # A run resumed with changed settings ran part of its steps under others than its saved config says: it is
    # a setting of its own, never a seed of the config it ended with.
    changes = [{"step": r["step"], "changed": changed} for r in records
               if (changed := {key: values for key, values in r.get("changed", {}).items() if changes_setting(key)})]
    # A launch that read other shards (a corpus prepared again, another sample in the same directory) changed the
    # data even where the config did not.
    launches = [r for r in records if "data" in r]
    first_read = data_size(launches[0]["data"]) if launches else None
    changes += [{"step": r["step"], "changed": {"data.read": [first_read, data_size(r["data"])]}}
                for r in launches[1:] if data_size(r["data"]) != first_read]
    if changes:
        setting["changed_on_resume"] = changes
    return Run(name=str(run_dir), corpus=corpus, model=model_label(cfg["model"]),
               optimizer=optimizer_label(cfg["optimizer"]), budget=budget,
               setting=json.dumps(setting, sort_keys=True), lr=cfg["optimizer"]["lr"],
               gamma=cfg["optimizer"].get("gamma"), records=records, max_iters=cfg["train"]["max_iters"],
               config=cfg, data=launches[0]["data"] if launches else None,
               code=[code_label(r["launch"]) for r in records if "launch" in r], failure=failure,
               modified=last_modified(run_dir))


class OlderVersionRun(ValueError):
    """A run directory that an older version of this project wrote: what it ran is not known for certain."""


def check_written_by_this_version(run_dir: Path, cfg: dict) -> None:
    """Raise :class:`OlderVersionRun` if the run's saved config lacks keys of the schema: an older version wrote
    it, and the values it ran for them (not always today's defaults) are unknown."""
    entry = OPTIMIZERS.get(cfg["optimizer"]["name"])
    schemas = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig,
               "optimizer": entry.schema if entry else None}
    missing = [f"{section}.{f.name}" for section, schema in schemas.items() if schema is not None
               for f in dataclasses.fields(schema) if f.name not in cfg[section]]
    if missing:
        raise OlderVersionRun(f"{run_dir}: left out, written by an older version of this project (its config has "
                              f"no {', '.join(missing)}): train it again to tabulate it")


def readable_runs(run_dirs: list[Path]) -> tuple[list[Run], list[str]]:
    """The runs in ``run_dirs``, and one note for each directory left out (each also logged as a warning): one
    that cannot be read, naming its file (one broken directory among a hundred runs is not the end of the table),
    or one an older version wrote."""
    runs, left_out = [], []
    for run_dir in run_dirs:
        try:
            runs.append(load_run(run_dir))
        except UnreadableRun as err:
            log.warning("warning: skipping %s: %s", run_dir, err)
            left_out.append(f"{run_dir}: unreadable, {err}")
        except OlderVersionRun as err:
            log.warning("%s", err)
            left_out.append(str(err))
    return runs, left_out


def last_modified(run_dir: Path) -> float:
    """When the run last logged or failed."""
    return max((path.stat().st_mtime for path in map(run_dir.joinpath, RUN_FILES) if path.is_file()), default=0.0)


def unlabelled_failure(run_dir: Path, failure: dict) -> Run:
    """A failed point whose overrides no longer compose: a setting of its own, known by its overrides."""
    return Run(name=str(run_dir), corpus=UNKNOWN, model=UNKNOWN, optimizer=UNKNOWN, budget=0,
               setting=json.dumps({"overrides": failure["overrides"]}), failure=failure,
               modified=last_modified(run_dir))


def code_label(launch: dict) -> str:
    """A launch's code as a table shows it: the commit's first 7 digits, ``+`` if it ran uncommitted changes
    (saved in the run's ``code/`` directory), ``unknown`` where it ran outside a git checkout."""
    if launch["commit"] is None:
        return "unknown"
    return launch["commit"][:7] + ("+" if launch["patch"] else "")


def data_size(data: dict) -> dict[str, int]:
    """Tokens per split of a launch's data record: what tells two corpora, or two samples of one, apart."""
    return {split: read["tokens"] for split, read in sorted(data.items())}


def data_label(data: dict | None) -> str:
    """``HuggingFaceFW/fineweb-edu sample-100BT, 96,000,000,000 train tokens``, or ``not recorded``."""
    if data is None:
        return "not recorded"
    train = data.get("train", {})
    size = f"{train.get('tokens', 0):,} train tokens"
    return f"{train['source']}, {size}" if train.get("source") else size


def changes_setting(key: str) -> bool:
    """Whether a change of a config key (``optimizer.lr``) on resume makes a run a setting of its own.

    So does a change of a key of what :func:`load_run` calls a run's setting, of the global batch (a resume by
    another number of processes), and one of the seed or the data (even of a named corpus' data.dir: fineweb-edu's
    10B and 100B samples lie in two directories; or the shards read): the run shares its first steps and initial
    weights with the seed it started as, and is no independent seed.
    """
    section, _, name = key.partition(".")
    return section in ("model", "optimizer", "data") or (
        section == "train" and name in (*SETTING_KEYS, "seed", "global_batch_size"))


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


# The files one of which a run directory holds: its log, or (a point refused before it logged) its failure.
RUN_FILES = (METRICS_FILE, FAILURE_FILE)


def find_run_dirs(patterns: list[str]) -> list[Path]:
    """Run directories matched by glob ``patterns``, or found anywhere below a matched directory."""
    found = set()
    for pattern in patterns:
        for match in map(Path, matching_paths(pattern)):
            if any((match / name).is_file() for name in RUN_FILES):
                found.add(match)
            elif match.is_dir():
                found.update(path.parent for name in RUN_FILES for path in match.rglob(name))
    return sorted(path for path in found if is_run_dir(path))


def is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "config.yaml").is_file() or (path / FAILURE_FILE).is_file()


def matching_paths(pattern: str) -> list[str]:
    """The paths glob ``pattern`` matches; a pattern that matches nothing is a mistake the user must hear of (a
    table or figure without those runs would look complete)."""
    matches = glob.glob(str(Path(pattern).expanduser()), recursive=True)
    if not matches:
        raise FileNotFoundError(f"no run directory matches {pattern}: check the path (quote a glob pattern, so "
                                "that the script expands it, not the shell)")
    return matches


def load_runs(patterns: list[str]) -> list[Run]:
    """The runs in the directories ``patterns`` match, but those left out (each named in a warning)."""
    return readable_runs(find_run_dirs(patterns))[0]


@dataclass
class LeftOut:
    """A run not counted as a seed: another run of its setting has its seed."""

    run: Run
    kept: Run

    @property
    def reason(self) -> str:
        """``seed 1337 as sweep-a/0_lr=0.01, which trained further (step 100 vs 40)``."""
        run, kept = self.run, self.kept
        if run.failed != kept.failed:
            why = "did not fail"
        elif run.last_step != kept.last_step:
            why = f"trained further (step {kept.last_step:,} vs {run.last_step:,})"
        else:
            why = "is newer, as far as it trained"
        return f"seed {run.seed} as {short_name(kept)}, which {why}"


def short_name(run: Run) -> str:
    """The run's directory and its parent's (``12-30-00/3_gamma=0.05``): sweep points of two sweeps differ in
    the parent."""
    return "/".join(Path(run.name).parts[-2:])


@dataclass
class Setting:
    """The seeds of one configuration."""

    runs: list[Run]
    # What its runs read, when runs of the same config read different data and were told apart by it.
    read: str | None = None
    left_out: list[LeftOut] = field(default_factory=list)  # runs of a seed that another of its runs has

    @property
    def first(self) -> Run:
        return self.runs[0]

    @property
    def failed(self) -> bool:
        """Whether its runs failed (refused, diverged, ...): :func:`split_failed` keeps them apart from the rest."""
        return all(run.failed for run in self.runs)

    @property
    def best_val_losses(self) -> list[float]:
        """The best validation loss of each seed; none for failed runs, whose losses are never a result."""
        return [run.best_val_loss for run in self.runs if run.best_val_loss is not None and not run.failed]

    @property
    def mean_best_val_loss_fixed(self) -> float | None:
        losses = [run.best_val_loss_fixed for run in self.runs if run.best_val_loss_fixed is not None and not run.failed]
        return statistics.fmean(losses) if losses else None

    @property
    def final_val_losses(self) -> list[float]:
        """The last validation loss of each seed, failed ones too: how far a blow-up went."""
        return [run.final_val_loss for run in self.runs if run.final_val_loss is not None]

    @property
    def mean_best_val_loss(self) -> float:
        losses = self.best_val_losses
        return statistics.fmean(losses) if losses else math.inf

    @property
    def code(self) -> list[str]:
        """The code its runs' launches ran (:func:`code_label`), each once, in the order of the runs."""
        return list(dict.fromkeys(label for run in self.runs for label in run.code))

    @property
    def stopped_runs(self) -> list[Run]:
        """The seeds that stopped short of their max_iters (or are still going), without those that failed."""
        return [run for run in self.runs if run.stopped_early and not run.failed]

    def best_val_losses_within(self, tokens: float) -> list[float]:
        """Each seed's best validation loss within its first ``tokens``, for the seeds that got past them."""
        losses = (run.best_val_loss_within(tokens) for run in self.runs if not run.failed)
        return [loss for loss in losses if loss is not None]


def setting_labels(settings: list[Setting]) -> list[str]:
    """What tells the settings of one group apart, one label each: the keys whose values differ, e.g.
    ``gamma=0.05, lr=0.003`` (empty for a single setting)."""
    return [", ".join(f"{key.rsplit('.', 1)[-1]}={value}" for key, value in differences.items())
            for differences in setting_differences(settings)]


def setting_differences(settings: list[Setting]) -> list[dict]:
    """The keys whose values differ between ``settings`` (sorted), and each setting's values of them."""
    flat = [{**flat_items(json.loads(setting.first.setting)),
             **({"data.read": setting.read} if setting.read else {})} for setting in settings]
    keys = sorted({key for items in flat for key in items if any(items.get(key) != other.get(key) for other in flat)})
    # Values as the run ran them: the setting leaves out optimizer keys at their defaults.
    values = [{**items, **flat_items(setting.first.config)} for items, setting in zip(flat, settings)]
    return [{key: items.get(key) for key in keys} for items in values]


def numeric_order(values) -> tuple:
    """A sort key that puts numbers in numeric order (0.005 before 0.025 before 0.05), before anything else."""
    return tuple((0, value, "") if isinstance(value, int | float) and not isinstance(value, bool)
                 else (1, 0, str(value)) for value in values)


def group_settings(runs: list[Run]) -> dict[tuple[str, str, float, str], list[Setting]]:
    """Settings (seeds pooled) under (corpus, model, nominal token budget, optimizer), best mean first; the
    corpus as :func:`short_corpus_names` names it."""
    by_setting: dict[str, list[Run]] = {}
    for run in runs:
        by_setting.setdefault(run.setting, []).append(run)
    corpus_names = short_corpus_names({run.corpus for run in runs})
    groups: dict[tuple[str, str, float, str], list[Setting]] = {}
    for runs_of_setting in by_setting.values():
        run = runs_of_setting[0]
        key = (corpus_names[run.corpus], run.model, nominal_tokens(run.budget), run.optimizer)
        for setting in split_by_data_read(runs_of_setting):
            groups.setdefault(key, []).extend(split_failed(one_run_per_seed(setting)))
    for settings in groups.values():
        settings.sort(key=lambda setting: setting.mean_best_val_loss)
    return groups


def split_by_data_read(runs: list[Run]) -> list[Setting]:
    """The runs of one config as settings, told apart by the data they read (tokens per split, as train.py logs
    them): fineweb-edu's 10B and 100B samples, or a corpus prepared twice, are never seeds of each other, wherever
    they lie. Runs logged before train.py recorded it join the others if those all read the same data, else they
    stand apart (``read=not recorded``)."""
    sizes = [None if run.data is None else json.dumps(data_size(run.data)) for run in runs]
    if len(set(sizes) - {None}) <= 1:
        return [Setting(runs)]
    parts: dict[str | None, list[Run]] = {}
    for run, size in zip(runs, sizes):
        parts.setdefault(size, []).append(run)
    return [Setting(members, read=data_label(members[0].data)) for members in parts.values()]


def one_run_per_seed(setting: Setting) -> Setting:
    """The setting with one run per seed: of runs with the same train.seed (a sweep and a re-run of it, each
    point once in each), one is a run and not two seeds. Kept: one that did not fail, then the one that trained
    furthest, then the newest; the others are named in ``left_out``."""
    by_seed: dict[object, list[Run]] = {}
    for run in setting.runs:
        by_seed.setdefault(run.name if run.seed is None else run.seed, []).append(run)
    kept, left_out = [], []
    for runs in by_seed.values():
        best = max(runs, key=lambda run: (not run.failed, run.last_step, run.modified))
        kept.append(best)
        left_out += [LeftOut(run, best) for run in runs if run is not best]
    kept_ids = {id(run) for run in kept}
    return Setting([run for run in setting.runs if id(run) in kept_ids], setting.read, left_out)


def split_failed(setting: Setting) -> list[Setting]:
    """The setting's healthy runs and its failed ones (refused, diverged, ...) as two settings: a failed run is
    never a seed whose loss is averaged with the others; it stands in a row of its own, marked with why."""
    parts = [[run for run in setting.runs if not run.failed], [run for run in setting.runs if run.failed]]
    return [Setting(runs, setting.read, [left for left in setting.left_out if any(left.kept is run for run in runs)])
            for runs in parts if runs]


def size_order(model: str) -> tuple[int, str]:
    return (SIZE_ORDER.index(model) if model in SIZE_ORDER else len(SIZE_ORDER), model)


def optimizer_order(optimizer: str) -> tuple[int, str]:
    names = list(OPTIMIZER_NAMES)
    return (names.index(optimizer) if optimizer in names else len(names), optimizer)


def display_corpus(corpus: str) -> str:
    return CORPUS_NAMES.get(corpus, corpus)


def display_model(model: str) -> str:
    return f"GPT-2 {model}" if model in SIZE_ORDER else model


def display_optimizer(optimizer: str) -> str:
    return OPTIMIZER_NAMES.get(optimizer, optimizer)


def plot_command(prog: str, doc: str, default_out: str, plot: Callable[..., list[Path]],
                 argv: list[str] | None = None,
                 add_options: Callable[[argparse.ArgumentParser], None] | None = None) -> None:
    """The command line of a figure script: run patterns in, the PNG paths written out (or one error line).

    ``add_options`` adds the script's own options, which reach ``plot`` as keyword arguments.
    """
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories or glob patterns (quote them)")
    parser.add_argument("--out", type=Path, default=Path(default_out), help="directory for the PNG files")
    if add_options:
        add_options(parser)
    args = vars(parser.parse_args(sys.argv[1:] if argv is None else argv))
    patterns, out = args.pop("runs"), args.pop("out")
    try:
        for path in plot(load_runs(patterns), out, **args):
            print(path)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    except OSError as err:  # a full disk, a read-only directory
        raise SystemExit(unwritable_output(err, out)) from None


def unwritable_output(err: OSError, out: Path) -> str:
    """The one line for an output that could not be written (``err`` names the file where it knows it)."""
    return f"error: cannot write {err.filename or out} ({err.strerror or err}): free space, or choose another --out"
