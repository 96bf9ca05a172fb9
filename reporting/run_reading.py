"""Training runs read back from their directories: each into a :class:`Run` with its config, metrics, failure
record and launches.

A run directory is what train.py writes: ``metrics.jsonl`` and ``.hydra/config.yaml``. Each run is labelled by
corpus, model size, optimizer and token budget (``reporting.run_labels``), and carries a ``setting``: its config up
to the seed and the settings that do not change the result (device, paths, logging, checkpointing, where a named
corpus lies); a run resumed with changed settings, seed or data (a ``changed`` record in its log, or other shards
read) is a setting of its own. A run whose last logged step is short of its ``max_iters`` (``Run.stopped_early``)
stopped or is still going: the table and the figures mark it.
A sweep point that was refused, diverged or failed holds ``failure.json`` (its kind, reason, last step and
overrides; a refused point may hold nothing else): it is a run too (``Run.failure``).
A run's best validation loss is that of its evaluations after step 0 (the step-0 one scores the untrained model);
a diverged run's best is that before it diverged (``Run.best_val_loss_before_diverging``); besides it, its final one (``Run.final_val_loss``) shows a late blow-up, and its best within the first B tokens
(``Run.best_val_loss_within``) is what a shorter budget B reads off a longer run.
Which runs count as seeds of one setting is ``reporting.run_selection``'s subject.
"""
import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from configs.compose import register_configs
from configs.registry import OPTIMIZERS
from configs.resolvers import resolved_container
from configs.schema import DataConfig, ModelConfig, TrainConfig
from reporting.run_labels import code_label, corpus_of, model_label, nominal_tokens, optimizer_label, without_defaults
from training.checkpoint import newest_checkpoint_step
from training.metrics import METRICS_FILE, read_metrics
# What train.py writes into a run that was refused, diverged or failed otherwise: {kind, reason, step, overrides, time}.
from training.sweep import FAILURE_FILE

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
UNKNOWN = "unknown"  # the corpus, model and optimizer of a failed point whose overrides no longer compose
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
    saved_step: int = 0  # its newest checkpoint's step: a stop saves one past its last logged step

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
    def best_val_loss_before_diverging(self) -> float | None:
        """A diverged run's best validation loss before the step it diverged at (after step 0, as any best): how
        far it got before its blow-up. None for a run that did not diverge, or diverged before an evaluation."""
        if not self.failed or self.failure["kind"] != "diverged":
            return None
        losses = [r["val/loss"] for r in self.trained_evaluations
                  if r["step"] < self.failure.get("step", 0) and math.isfinite(r["val/loss"])]
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
        return max(max((r["step"] for r in self.records), default=0), self.saved_step)

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
    """The config train.py saved in ``.hydra/config.yaml``, resolved, checked to hold the sections labels come from."""
    try:
        cfg = resolved_container(OmegaConf.load(path))
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
               modified=last_modified(run_dir), saved_step=newest_checkpoint_step(run_dir))


class OlderVersionRun(ValueError):
    """A run directory that an older version of this project wrote: what it ran is not known for certain."""


def check_written_by_this_version(run_dir: Path, cfg: dict) -> None:
    """Raise :class:`OlderVersionRun` if the run's saved config lacks keys of the schema: an older version wrote
    it, and the values it ran for them (not always today's defaults) are unknown."""
    entry = OPTIMIZERS.get(cfg["optimizer"]["name"])
    schema = entry.schema if entry else None
    schemas = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "optimizer": schema}
    missing = [f"{section}.{f.name}" for section, schema in schemas.items() if schema is not None
               for f in dataclasses.fields(schema) if f.name not in cfg[section]]
    if missing:
        raise OlderVersionRun(f"{run_dir}: left out, written by an older version of this project (its config has "
                              f"no {', '.join(missing)}): train it again to tabulate it")


def last_modified(run_dir: Path) -> float:
    """When the run last logged or failed."""
    return max((path.stat().st_mtime for path in map(run_dir.joinpath, RUN_FILES) if path.is_file()), default=0.0)


def unlabelled_failure(run_dir: Path, failure: dict) -> Run:
    """A failed point whose overrides no longer compose: a setting of its own, known by its overrides."""
    return Run(name=str(run_dir), corpus=UNKNOWN, model=UNKNOWN, optimizer=UNKNOWN, budget=0,
               setting=json.dumps({"overrides": failure["overrides"]}), failure=failure,
               modified=last_modified(run_dir))


def data_size(data: dict) -> dict[str, int]:
    """Tokens per split of a launch's data record: what tells two corpora, or two samples of one, apart."""
    return {split: read["tokens"] for split, read in sorted(data.items())}


def changes_setting(key: str) -> bool:
    """Whether a change of a config key (``optimizer.lr``) on resume makes a run a setting of its own.

    So does a change of a key of what :func:`load_run` calls a run's setting, of the global batch (a resume by
    another number of processes), and one of the seed or the data (even of a named corpus' data.dir: fineweb-edu's
    10B and 100B samples lie in two directories; or the shards read): the run shares its first steps and initial
    weights with the seed it started as, and is no independent seed."""
    section, _, name = key.partition(".")
    return section in ("model", "optimizer", "data") or (
        section == "train" and name in (*SETTING_KEYS, "seed", "global_batch_size"))


# The files one of which a run directory holds: its log, or (a point refused before it logged) its failure.
RUN_FILES = (METRICS_FILE, FAILURE_FILE)


def is_run_dir(path: Path) -> bool:
    return (path / ".hydra" / "config.yaml").is_file() or (path / FAILURE_FILE).is_file()
