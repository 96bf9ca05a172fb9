"""Run logging: metrics.jsonl always (no network needed), wandb when enabled, one console line per event."""
import contextlib
import json
import logging
import os
import shutil
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig

from configs.schema import WandbMode
from training.atomic import atomic_file

log = logging.getLogger("train")

METRICS_FILE = "metrics.jsonl"
WANDB_DIR = "wandb"  # wandb.init(dir=run_dir) keeps its runs there
# Records a launch writes at its first step, before it trains.
LAUNCH_KEYS = {"resumed_from", "data", "evaluation", "launch"}
# Where a launch record goes in the wandb run's config.
WANDB_LAUNCH_KEYS = {"data": "data_read", "evaluation": "evaluation", "launch": "launch"}


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    records = []
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                record = None
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
            else:
                # A run killed mid-write leaves a torn last line (a disk error, garbage); what came before is intact.
                log.warning("ignoring a torn or foreign line in %s: %r", path, line[:80])
    return records


# How a log line shows each value, in its order.
RECORD_FORMATS = {"train/loss": ".4f", "val/loss": ".4f", "val/perplexity": ".2f", "val/loss_fixed": ".4f", "train/loss_estimate": ".4f",
                  "lr": ".2e", "grad_norm": ".3f", "clipped": ".0%", "tokens": ",d", "tokens_per_s": ",.0f",
                  "step_ms": ".1f", "mfu": ".1%", "peak_memory_gb": ".2f", "skipped_steps": "d",
                  "hellaswag/acc_norm": ".3f"}


def format_record(record: dict) -> str:
    parts = [f"step {record['step']}"]
    for key, fmt in RECORD_FORMATS.items():
        if record.get(key) is not None:
            parts.append(f"{key} {record[key]:{fmt}}")
    if record.get("eta_s") is not None:
        parts.append(f"eta {format_duration(record['eta_s'])}")
    return " | ".join(parts)


def format_duration(seconds: float) -> str:
    """1h02m03s, 4m05s or 6s."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def default_run_name(cfg) -> str:
    """The wandb run's name when ``wandb.run_name`` is null: model, optimizer and corpus."""
    choices = HydraConfig.get().runtime.choices
    return f"{choices.get('model', 'model')}-{choices.get('optimizer', cfg.optimizer.name)}-{cfg.data.name}"


class WandbUnavailable(ValueError):
    """wandb was asked for and cannot start; the message says how to log in or run without it."""


class MetricsWriteError(ValueError):
    """metrics.jsonl could not be appended to; the message says why and how to go on."""


def start_wandb_run(run_dir: Path, wandb_cfg, config: dict, run_name: str, wandb_run_id: str | None):
    """The wandb run of this launch, waiting ``wandb.init_timeout_s`` for the server at most. A start that fails
    leaves nothing of it in ``run_dir``: the run directory is as reusable as after a refused launch (a rerun there
    with wandb.mode=disabled is no fresh start in a directory that holds a run)."""
    import wandb

    wandb_dir = run_dir / WANDB_DIR
    before = wandb_entries(wandb_dir)
    try:
        return wandb.init(project=wandb_cfg.project, entity=wandb_cfg.entity, name=run_name, config=config,
                          mode=wandb_cfg.mode.value, dir=str(run_dir), id=wandb_run_id, resume="allow",
                          settings=wandb.Settings(init_timeout=wandb_cfg.init_timeout_s))
    except Exception as err:  # no credentials, no network, an unknown entity, a stray WANDB_* variable
        with contextlib.suppress(Exception):  # its service stops and its lines come out now, before the error's
            wandb.teardown()
        remove_entries_since(wandb_dir, before)
        # wandb's own advice names its Python API; this launch's setting is wandb.init_timeout_s.
        reason = " ".join(str(err).split()).split(" Consider increasing the init_timeout setting")[0][:300]
        timed_out = any(words in str(err).lower() for words in ("timed out", "timeout", "deadline exceeded"))
        waited = f" within wandb.init_timeout_s={wandb_cfg.init_timeout_s:g}" if timed_out else ""
        raise WandbUnavailable(
            f"wandb.mode={wandb_cfg.mode.value} could not start a wandb run{waited} ({reason}): log in with `wandb "
            "login` (or set WANDB_API_KEY), raise wandb.init_timeout_s for a slow server, or run with "
            "wandb.mode=offline (upload later with `wandb sync`) or wandb.mode=disabled in the same run directory; "
            "metrics.jsonl is written either way") from None


def wandb_entries(wandb_dir: Path) -> dict[str, str | None] | None:
    """The names in ``wandb_dir``, each with its target if it is a link (wandb's latest-run); None without it."""
    if not wandb_dir.is_dir():
        return None
    return {entry.name: os.readlink(entry) if entry.is_symlink() else None for entry in wandb_dir.iterdir()}


def remove_entries_since(wandb_dir: Path, before: dict[str, str | None] | None) -> None:
    """Remove what wandb wrote in ``wandb_dir`` since :func:`wandb_entries` gave ``before``, and point its links
    (latest-run, which wandb re-points) where they pointed then. What cannot be removed stays: the error that
    started the clean-up is the one to tell."""
    with contextlib.suppress(OSError):
        if before is None:
            shutil.rmtree(wandb_dir)
            return
        for entry in wandb_dir.iterdir():
            if entry.name not in before or before[entry.name] is not None:
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        for name, target in before.items():
            if target is not None:
                (wandb_dir / name).symlink_to(target)


class MetricsLogger:
    """Appends one JSON object per event to ``metrics.jsonl`` and mirrors it to wandb.

    Under DDP only rank 0 logs: the others get ``enabled=False`` and every call is a no-op.
    """

    def __init__(self, run_dir: Path, wandb_cfg, config: dict, run_name: str, wandb_run_id: str | None = None,
                 enabled: bool = True):
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled
        self.wandb_run = None
        if enabled and wandb_cfg.mode != WandbMode.disabled:
            self.wandb_run = start_wandb_run(Path(run_dir), wandb_cfg, config, run_name, wandb_run_id)

    @property
    def wandb_run_id(self) -> str | None:
        return self.wandb_run.id if self.wandb_run else None

    def discard_after(self, step: int) -> None:
        """Drop records past ``step``: a resumed run rewrites what the interrupted one logged after its checkpoint.

        Also dropped: the records of an earlier launch from ``step`` itself (its resume, the data it read), whose
        steps are gone (this launch writes its own). The log is replaced atomically (temp file, fsync, rename): a
        kill while it is being rewritten leaves the old log, never an empty one.
        """
        if not self.enabled:
            return
        kept = [r for r in read_metrics(self.path.parent)
                if r["step"] < step or (r["step"] == step and not LAUNCH_KEYS & r.keys())]
        try:
            with atomic_file(self.path) as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
        except OSError as err:  # a full disk or quota, a vanished or read-only directory: the old log is intact
            raise MetricsWriteError(f"could not rewrite {self.path} ({err.strerror or err}): free space or fix the "
                                    "directory, then resume with train.resume=true (the log and the checkpoints "
                                    "are intact)") from None

    def record(self, record: dict) -> None:
        """Append ``record`` to the log file only (an event such as a resume, not a metric)."""
        if not self.enabled:
            return
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")
        except OSError as err:  # a full disk or quota, a vanished or read-only directory
            raise MetricsWriteError(f"could not append to {self.path} ({err.strerror or err}): free space or fix "
                                    "the directory, then resume with train.resume=true (the checkpoints are "
                                    "intact)") from None

    def record_launch(self, step: int, key: str, value: dict) -> None:
        """Record what this launch reads (``data``) or runs (``launch``: code, libraries, hosts): in the log file,
        and in the wandb run's config (``data_read``, ``launch``), where a look at the run tells which corpus it
        trained on and which code trained it."""
        self.record({"step": step, key: value})
        self._mirror(f"at step {step}",
                     lambda run: run.config.update({WANDB_LAUNCH_KEYS[key]: value}, allow_val_change=True))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self.record(record)
        self._mirror(f"at step {record['step']}",
                     lambda run: run.log({k: v for k, v in record.items() if k != "step"}, step=record["step"]))
        log.info(format_record(record))

    def close(self) -> None:
        self._mirror("at the run's end", lambda run: run.finish())

    def _mirror(self, when: str, send) -> None:
        """``send(wandb_run)``, if there is one. A wandb that fails under the run (its service process gone) is let
        go with one warning and the run trains on: metrics.jsonl, the run's record, has every step."""
        if self.wandb_run is None:
            return
        try:
            send(self.wandb_run)
        except Exception as err:
            import wandb

            self.wandb_run = None
            reason = " ".join(str(err).split())[:300] or type(err).__name__
            log.warning("wandb failed %s (%s): the run goes on without it, every record in %s", when, reason,
                        self.path)
            with contextlib.suppress(Exception):  # the service it would stop may be gone already
                wandb.teardown()


class StepWindow:
    """The training steps since the last logged one: the record of a log line sums them up (throughput at the
    recent step time, the share of clipped steps, an ETA). Only the steps' own time counts: evaluations and
    checkpoints come on top."""

    def __init__(self, tokens_per_step: int, max_iters: int, flops_per_token: float, peak_flops: float | None,
                 world_size: int, device: torch.device):
        self.tokens_per_step, self.max_iters, self.device = tokens_per_step, max_iters, device
        self.flops_per_token, self.peak_flops, self.world_size = flops_per_token, peak_flops, world_size  # for MFU
        self.seconds, self.steps, self.clipped = 0.0, 0, 0

    def add(self, seconds: float, clipped: bool) -> None:
        self.seconds += seconds
        self.steps += 1
        self.clipped += clipped

    def record(self, step: int, tokens: int, lr: float, loss: float, grad_norm: float, skipped_steps: int) -> dict:
        """The log record of ``step``, which closes the window."""
        tokens_per_s = self.steps * self.tokens_per_step / self.seconds
        record = {"step": step, "tokens": tokens, "lr": lr, "train/loss": loss, "grad_norm": grad_norm,
                  "clipped": self.clipped / self.steps, "tokens_per_s": tokens_per_s,
                  "step_ms": 1000 * self.seconds / self.steps,
                  "eta_s": (self.max_iters - step) * self.seconds / self.steps}
        if skipped_steps:
            record["skipped_steps"] = skipped_steps
        if self.peak_flops:  # None where the device's peak is unknown
            record["mfu"] = tokens_per_s / self.world_size * self.flops_per_token / self.peak_flops
        if self.device.type == "cuda":
            record["peak_memory_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.seconds, self.steps, self.clipped = 0.0, 0, 0
        return record
