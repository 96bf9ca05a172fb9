"""How soon each setting reached a validation loss: tokens and training time, and their ratio to the first optimizer.

Used by ``scripts.make_table --target-loss X``. A run reaches X between two evaluations, the first at or below X
and the one before it: the tokens and the training time there are interpolated linearly in the loss between
those two evaluations. Training time is the sum of the logged ``step_ms`` (``run_reading.training_seconds``):
train.py logs no wall-clock time, so evaluations and checkpoints are left out.
"""
import statistics
from dataclasses import dataclass

import numpy as np

from reporting.run_labels import count_label
from reporting.run_reading import Run, training_seconds
from reporting.run_selection import Setting
from training.metrics import format_duration

MISSING = "–"


@dataclass
class Reached:
    tokens: float
    seconds: float | None  # None where the run logged no step times (a wandb export)


def reached(run: Run, target: float) -> Reached | None:
    """Where ``run``'s validation loss first reached ``target``, or None if it never did."""
    evaluations = sorted(run.evaluations, key=lambda record: record["step"])
    index = next((i for i, record in enumerate(evaluations) if record["val/loss"] <= target), None)
    if index is None:
        return None
    after = evaluations[index]
    before = evaluations[index - 1] if index > 0 else after
    fraction = 0.0 if before is after else (before["val/loss"] - target) / (before["val/loss"] - after["val/loss"])
    steps = np.array([before["step"], after["step"]])
    tokens = np.array([evaluation_tokens(run, before), evaluation_tokens(run, after)])
    timed = any("step_ms" in record for record in run.records)
    seconds = training_seconds(run, steps) if timed else None
    return Reached(tokens=float(tokens[0] + fraction * (tokens[1] - tokens[0])),
                   seconds=None if seconds is None else float(seconds[0] + fraction * (seconds[1] - seconds[0])))


def evaluation_tokens(run: Run, record: dict) -> float:
    """The tokens an evaluation was made at: logged by train.py, or step x tokens per step (a wandb export)."""
    return record["tokens"] if "tokens" in record else record["step"] * run.budget / run.max_iters


@dataclass
class SettingReach:
    """The seeds of a setting that reached the target, and how many seeds it has."""

    reached: list[Reached]
    seeds: int

    @property
    def tokens(self) -> float | None:
        return statistics.fmean(r.tokens for r in self.reached) if self.reached else None

    @property
    def seconds(self) -> float | None:
        times = [r.seconds for r in self.reached if r.seconds is not None]
        return statistics.fmean(times) if times and len(times) == len(self.reached) else None


def setting_reach(setting: Setting, target: float) -> SettingReach:
    runs = [run for run in setting.runs if not run.failed]
    return SettingReach([r for r in (reached(run, target) for run in runs) if r is not None], len(runs))


def spread(values: list[float], show) -> str:
    """`` ± <sd>`` over several seeds, else nothing."""
    return f" ± {show(statistics.stdev(values))}" if len(values) > 1 else ""


def reach_cells(reach: SettingReach, reference: SettingReach | None) -> list[str]:
    """Tokens, training time, and each as a ratio to ``reference`` (the first optimizer's setting)."""
    if not reach.reached:
        return ["not reached", "not reached", MISSING, MISSING]
    some = f" ({len(reach.reached)} of {reach.seeds} seeds)" if len(reach.reached) < reach.seeds else ""
    tokens = count_label(reach.tokens) + spread([r.tokens for r in reach.reached], count_label) + some
    time = MISSING
    if reach.seconds is not None:
        time = duration_label(reach.seconds) + spread([r.seconds for r in reach.reached], duration_label) + some
    return [tokens, time, ratio(reach.tokens, reference and reference.tokens),
            ratio(reach.seconds, reference and reference.seconds)]


def duration_label(seconds: float) -> str:
    """9.38s below a minute (short runs differ in tenths), else 1h02m03s."""
    return f"{seconds:.3g}s" if seconds < 60 else format_duration(seconds)


def ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return MISSING
    return f"{value / reference:.2f}x"


def target_table(rows: list[tuple[tuple, Setting, list[str]]], target: float) -> list[str]:
    """One row per setting: its label cells (corpus, model, tokens, optimizer, lr, gamma, as in the table of
    every setting), then the tokens and training time to ``target`` and their ratios to the first row of its
    (corpus, model, budget): the best setting of the table's first optimizer there."""
    lines = [f"### Tokens and training time to validation loss {target:g}", "",
             "| corpus | model | tokens | optimizer | lr | gamma | seeds | tokens to target | training time to target "
             "| tokens ratio | time ratio |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    references: dict[tuple, SettingReach] = {}
    for block, setting, labels in rows:
        if setting.failed:
            cells = [f"failed ({', '.join(run.failure['kind'] for run in setting.runs)})", MISSING, MISSING, MISSING]
        else:
            reach = setting_reach(setting, target)
            cells = reach_cells(reach, references.setdefault(block, reach))
        lines.append("| " + " | ".join([*labels, str(len(setting.runs)), *cells]) + " |")
    lines += ["", f"The tokens and the training time at which the validation loss first reached {target:g}, "
              "interpolated linearly between the two evaluations around it; the mean over the seeds that reached it "
              "(± their standard deviation; \"k of n seeds\" where not all did). Training time is the sum of the "
              "logged step_ms: training steps only, without evaluations and checkpoints (train.py logs no "
              "wall-clock time). Ratios: to the first row of the same corpus, model and token budget (the best "
              "setting of the first optimizer there); below 1 reached the target sooner.", ""]
    return lines
