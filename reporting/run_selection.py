"""Which runs count, and as seeds of what: the run directories that glob patterns match, those that can be read
(``reporting.run_reading``), and those runs grouped into settings.

A directory that cannot be read, or that an older version wrote, is left out with a note (:func:`readable_runs`).
Runs whose settings are equal and that read data of the same size (train.py logs the tokens of each split at each
launch) are seeds of one :class:`Setting`. A failed run (refused, diverged, ...) is never pooled with the healthy
seeds of its setting but a setting of its own (:func:`split_failed`). Two runs of one setting with the same
``train.seed`` (a sweep and a re-run of it in another directory) are one run, not two seeds: the one that trained
furthest is kept, and the other is named as left out (:func:`one_run_per_seed`).
Used by ``scripts.make_table``, ``scripts.plot_curves``, ``scripts.plot_sweep`` and ``reporting.target_loss``.
"""
import glob
import json
import logging
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from reporting.run_labels import data_label, nominal_tokens, short_corpus_names
from reporting.run_reading import RUN_FILES, OlderVersionRun, Run, UnreadableRun, data_size, is_run_dir, load_run
from training.resume import flat_items

log = logging.getLogger(__name__)


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


def where_stopped(runs: list[Run]) -> str:
    """``adamw-seed2 at step 1,200 of 10,000, ...``: runs by directory name and where they stopped."""
    return ", ".join(f"{Path(run.name).name} {run.stopped_at}" for run in runs)


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
