"""Run directories in train.py's format (metrics.jsonl, .hydra/config.yaml) for the table and plot scripts."""
import functools
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from configs.compose import register_configs

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
register_configs()


@functools.cache  # composing takes a fifth of a second; many runs of the tests share their overrides
def composed_config(overrides: tuple[str, ...]) -> DictConfig:
    """The config train.py saves for these overrides (read only: the cache hands the same one to every run)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides))


def write_run(run_dir: Path, overrides: list[str], val_losses: list[float], tokens_per_step: int,
              step_ms: float = 100.0, eval_steps: list[int] | None = None) -> Path:
    """A run evaluated at steps 0, k, 2k, ... (k = max_iters / (evaluations - 1)) with these validation losses.

    ``eval_steps`` gives other evaluation steps, one per loss (a run still going stops at its last). Training
    records are logged at every evaluation step, as train.py does when eval_interval is a multiple of
    log_interval; ``step_ms`` is the mean step time of each window.
    """
    cfg = composed_config(tuple(overrides))
    if eval_steps is None:
        every = cfg.train.max_iters // (len(val_losses) - 1)
        eval_steps = [i * every for i in range(len(val_losses))]
    (run_dir / ".hydra").mkdir(parents=True)
    OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    records = []
    for step, loss in zip(eval_steps, val_losses, strict=True):
        tokens = step * tokens_per_step
        if step > 0:
            records.append({"step": step, "tokens": tokens, "lr": 1e-3, "train/loss": loss + 0.01, "grad_norm": 0.5,
                            "tokens_per_s": tokens_per_step / step_ms * 1000, "step_ms": step_ms})
        records.append({"step": step, "tokens": tokens, "val/loss": loss})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def write_failure(run_dir: Path, kind: str, reason: str, step: int, overrides: list[str]) -> Path:
    """The failure.json train.py writes into a sweep point that was refused, diverged or failed otherwise."""
    run_dir.mkdir(parents=True, exist_ok=True)
    failure = {"kind": kind, "reason": reason, "step": step, "overrides": overrides, "time": "2026-11-25T06:00:00Z"}
    (run_dir / "failure.json").write_text(json.dumps(failure))
    return run_dir


@pytest.fixture
def make_run():
    return write_run


@pytest.fixture
def make_failure():
    return write_failure


@pytest.fixture
def paper_runs(tmp_path) -> Path:
    """GPT-2 small, OpenWebText, 5B tokens on 8 GPUs: AdamW with two seeds, MARS-approx at two gammas."""
    tokens = 491_520
    adamw = ["experiment=owt-gpt2-small-5b-adamw"]
    mars = ["experiment=owt-gpt2-small-5b-mars-approx"]
    write_run(tmp_path / "runs" / "adamw-seed1", adamw, [10.9, 3.6, 3.201], tokens)
    write_run(tmp_path / "runs" / "adamw-seed2", [*adamw, "train.seed=2"], [10.9, 3.7, 3.205], tokens, step_ms=120.0)
    write_run(tmp_path / "runs" / "mars-gamma0.025", mars, [10.9, 3.4, 3.110], tokens)
    write_run(tmp_path / "runs" / "mars-gamma0.05", [*mars, "optimizer.gamma=0.05"], [10.9, 3.5, 3.120], tokens)
    return tmp_path / "runs"
