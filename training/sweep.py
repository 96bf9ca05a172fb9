"""A sweep survives a bad point. A point that is refused, diverges or fails is recorded in its own directory
(``failure.json``, and ``rerun.sh``, which reruns it alone) and the next point runs; a point that another live
launch holds, or that finished already, is skipped, its directory left as it was. When the sweep ends, the process
that launched it names each failed point and exits non-zero, whether the points ran in it (``-m``) or in jobs of
their own (submitit, SLURM). One command resumes a run, or a sweep in its own directory (``resume_command``); a
sweep keeps it in ``resume.sh``."""
import contextlib
import datetime
import json
import logging
import os
import shlex
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from configs.schema import ConfigError
from data.loader import TokenBatches, TokenIdOutOfRange
from training.atomic import atomic_file
from training.checkpoint import CheckpointReadError, CheckpointSaveError, UnreadableCheckpoints
from training.distributed import DistributedContext, DistributedTimeout, all_gather_objects, stop_with_message
from training.divergence import TrainingDiverged
from training.preemption import TerminatedEarlier, received_signal
from training.provenance import DifferentCodeOnRanks, launcher_words
from training.run_dir import (LogFileWriteError, RunDirectoryError, RunDirectoryInUse, RunDirectoryLock,
                              RunDirectoryTaken, drop_held_job_log, previous_run_files, write_held_job_log)
from training.summary import Progress

log = logging.getLogger("train")

FAILURE_FILE = "failure.json"
RESUME_SCRIPT = "resume.sh"
RERUN_SCRIPT = "rerun.sh"  # in a failed sweep point's directory: reruns that point alone
RERUN_SCRIPT_HEAD = ("#!/bin/sh\n# Reruns this sweep point alone, in its directory: from its last checkpoint, or from step 0 "
                     "without one.\n# Change a setting below (a lower optimizer.lr, say) before running it.\n")
# The arguments a resume command sets itself: where the run or sweep lies, and how it starts there.
LAUNCH_ARGUMENTS = ("hydra.run.dir=", "hydra.sweep.dir=", "train.resume=", "train.overwrite=")

# In a sweep directory: one folder per launch of the sweep (two may run at once: a job submitted twice), named in
# SWEEP_LAUNCH_VARIABLE for its points, with one file per point saying how it ended (every launcher's jobs can
# write there, wherever they run); the launching process reads its own folder at the end, then removes it.
OUTCOMES_DIR = ".outcomes"
SWEEP_LAUNCH_VARIABLE = "TRAIN_SWEEP_LAUNCH"
_launched_sweep_dir: Path | None = None  # set in the process that launched a sweep, by SweepOutcomes
# Bad input, divergence and storage faults end a run with their one message, not a traceback.
ERRORS_TOLD_IN_ONE_LINE = (ValueError, FileNotFoundError, TrainingDiverged, CheckpointSaveError,
                           UnreadableCheckpoints, CheckpointReadError)
T = TypeVar("T")


class FaultOfEveryRank(ValueError):
    """One fault met alike (the same message) by every rank, such as shards none of them can use."""


class FaultOfAnotherRank(ValueError):
    """This rank is fine, but another one stopped: this one must stop too rather than wait for it."""


# Faults found alike by every rank (the config, or agreed on by a gather): under torchrun rank 0 alone tells them.
ERRORS_EVERY_RANK_MEETS = (ConfigError, RunDirectoryError, TrainingDiverged, CheckpointSaveError, DifferentCodeOnRanks,
                           TokenIdOutOfRange, FaultOfEveryRank, FaultOfAnotherRank)
# Faults that a restart of the job's workers would meet again (every rank's, or a rank that stopped answering and
# for which a restart would wait as long again): they end the job on every node, torchrun's --max-restarts or not.
ERRORS_A_RESTART_CANNOT_FIX = (*ERRORS_EVERY_RANK_MEETS, DistributedTimeout)


def on_every_rank_alike(make: Callable[[], T], ctx: DistributedContext) -> T:
    """``make()`` on every rank, where a fault may be every rank's (shards none can read) or one node's (a file
    system it lacks): either way every rank stops, none waiting at the next collective for a stopped one, and a
    fault every rank met alike is told once."""
    try:
        made, problem = make(), None
    except Exception as err:  # whatever stops this rank must stop the others too
        made, problem = None, err
    messages = all_gather_objects(None if problem is None else f"{problem}", ctx)
    if problem is not None:
        if ctx.world_size > 1 and isinstance(problem, ERRORS_TOLD_IN_ONE_LINE) and len(set(messages)) == 1:
            raise FaultOfEveryRank(f"{problem}") from problem
        raise problem
    failed = [(rank, message) for rank, message in enumerate(messages) if message is not None]
    if failed:
        rank, message = failed[0]
        raise FaultOfAnotherRank(f"rank {rank} stopped: {message}")
    return made


def stop_alike_on_bad_token_ids(batches: TokenBatches, ranks_that_met_some: float, ctx: DistributedContext) -> None:
    """Every rank stops with the same message once any rank's batches held an id beyond the vocabulary
    (``ranks_that_met_some``: how many, as the step's or the evaluation's all-reduce counted them); the message
    names the earliest such position any rank met."""
    if ranks_that_met_some:
        positions = [p for p in all_gather_objects(batches.bad_token_position, ctx) if p is not None]
        raise TokenIdOutOfRange(batches.bad_token_id_message(min(positions)))


def in_sweep() -> bool:
    return HydraConfig.get().mode == RunMode.MULTIRUN


def resume_command() -> str:
    """The command that continues this run where it stopped; in a sweep, the whole sweep in its own directory
    (finished points have nothing to do, the others resume from their checkpoints, failed ones are retried):
    ``bash <sweep>/resume.sh``, which the process that launched it wrote (a point that runs as a job of its own,
    submitit or SLURM, was started by another program than ``train.py``)."""
    hydra_cfg = HydraConfig.get()
    if not in_sweep():
        return runnable_from_anywhere(this_command_resumed(f"hydra.run.dir={hydra_value(hydra_cfg.run.dir)}"))
    sweep_dir = Path(hydra_cfg.sweep.dir)
    if has_resume_script(sweep_dir):
        return shlex.join(["bash", os.path.abspath(sweep_dir / RESUME_SCRIPT)])
    return runnable_from_anywhere(this_command_resumed(f"hydra.sweep.dir={hydra_value(sweep_dir)}"))


def runnable_from_anywhere(command: str) -> str:
    """``command`` as a line that runs as printed from any directory: after a ``cd`` into the one this process
    started in, where its relative words lead (``train.py``, ``hydra.run.dir=outputs/...``, a relative
    ``data.dir``), as the sweep's resume.sh does; its interpreter or launcher is named by its path
    (:func:`training.provenance.launcher_words`), so a shell without the venv activated runs it too."""
    return f"cd {shlex.quote(os.getcwd())} && {command}"


def hydra_value(path) -> str:
    """``path`` as the value of a Hydra override: quoted where it holds what Hydra's grammar reads otherwise (a
    sweep point's directory name holds its overrides' ``=`` and ``,``)."""
    text = str(path)
    if re.fullmatch(r"[\w./:@%+~-]+", text):
        return text
    # Within quotes Hydra reads a backslash as an escape only before a quote (or the closing one).
    escaped = re.sub(r"(\\*)(?='|$)", lambda run: run.group(1) * 2, text).replace("'", "\\'")
    return f"'{escaped}'"


TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "train.py"
LOWER_LR = "lower optimizer.lr or raise train.warmup_iters"


def divergence_advice(run_dir: Path) -> str:
    """What to do about a run that diverged: resume it with a lower lr. In a sweep, rerun this one point alone in
    its directory with its ``rerun.sh``, the lr in it lowered (the sweep's command holds every value of the
    sweep); the sweep's last lines give the command."""
    if not in_sweep():
        return f"{LOWER_LR.capitalize()}, then resume with those changes added to: {resume_command()}"
    return f"To rerun this point alone, {LOWER_LR} in its {RERUN_SCRIPT}"


def point_command(run_dir: Path) -> list[str]:
    """The single run that continues this sweep point in its directory, as words: train.py with the point's
    overrides."""
    overrides = [arg for arg in HydraConfig.get().overrides.task if not arg.lstrip("+~").startswith(LAUNCH_ARGUMENTS)]
    return [sys.executable, str(TRAIN_SCRIPT), *overrides, f"hydra.run.dir={hydra_value(run_dir)}",
            "train.resume=true"]


def write_rerun_script(run_dir: Path) -> Path:
    """Keep in a failed sweep point's directory the command that reruns it alone there, one setting a line, to
    change one (a lower lr) and run it: ``bash <point>/rerun.sh``. Returns the script."""
    script = Path(run_dir) / RERUN_SCRIPT
    words = [shlex.quote(word) for word in point_command(run_dir)]
    with atomic_file(script) as f:
        f.write(f"{RERUN_SCRIPT_HEAD}cd {shlex.quote(os.getcwd())} && exec {words[0]} {words[1]} \\\n"
                + "".join(f"  {word} \\\n" for word in words[2:-1]) + f"  {words[-1]}\n")
    script.chmod(0o755)
    return script


def this_command_resumed(where: str) -> str:
    """This process's command line with its launch arguments replaced by ``where`` and ``train.resume=true``,
    started as this process was (under torchrun or a launch script: the same number of processes)."""
    kept = [arg for arg in sys.argv[1:] if not arg.lstrip("+~").startswith(LAUNCH_ARGUMENTS)]
    return f"{launcher_words()} {shlex.join([*kept, where, 'train.resume=true'])}"


RESUME_SCRIPT_HEAD = ("#!/bin/sh\n# Resumes this sweep where it stopped: finished points are skipped, unfinished "
                      "ones continue from their checkpoints, failed ones are retried.\n")


def write_resume_script(sweep_dir: Path) -> None:
    """Keep the sweep's resume command in its directory, where it is found once the terminal is gone (by the
    process that launches the sweep: it alone knows the command)."""
    script = sweep_dir / RESUME_SCRIPT
    command = this_command_resumed(f"hydra.sweep.dir={hydra_value(sweep_dir)}")
    try:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with atomic_file(script) as f:
            f.write(f"{RESUME_SCRIPT_HEAD}cd {shlex.quote(os.getcwd())} && exec {command}\n")
        script.chmod(0o755)
    except OSError as err:
        log.warning("could not write %s: %s", script, err)


def has_resume_script(sweep_dir: Path) -> bool:
    """Whether ``sweep_dir`` holds the script that ``write_resume_script`` wrote, readable."""
    try:
        return (sweep_dir / RESUME_SCRIPT).read_text().startswith(RESUME_SCRIPT_HEAD)
    except OSError:
        return False


@contextlib.contextmanager
def failures_recorded(run_dir: Path, finished_at: Callable[[], int | None]) -> Iterator[Progress]:
    """Around one run, or one point of a sweep: yields the run's ``Progress``, and records how the run ended.

    A failed run is recorded in ``run_dir`` (``failure.json``) where the directory is this launch's; a single run
    then stops with its one message, a sweep goes on to its next point (and ``sweep_report`` names the failed ones
    at its end). A sweep point that another live launch holds, or that finished already (``finished_at``: the step
    the run in ``run_dir`` finished at, None if it did not), is skipped with one line. A termination signal stops
    the whole sweep. An unexpected error of a single run keeps its traceback.
    """
    sweep, progress = in_sweep(), Progress()
    try:
        yield progress
    except TerminatedEarlier as err:
        stop_sweep(f"{err}")
    except ERRORS_TOLD_IN_ONE_LINE as err:
        end_failed(run_dir, err, f"{err}", progress, sweep, finished_at)
    except Exception as err:
        if not sweep:
            if progress.took_over_run_dir or not previous_run_files(run_dir):
                write_held_job_log()
            raise
        log.exception("sweep point %s failed", run_dir)  # the traceback goes to its train.log; the sweep goes on
        end_failed(run_dir, err, f"{type(err).__name__}: {err}", progress, sweep, finished_at)
    else:
        if not progress.took_over_run_dir:  # nothing to do: the run's log stays as the run wrote it
            drop_held_job_log()
        if sweep:
            point_ended(run_dir)


def end_failed(run_dir: Path, err: Exception, reason: str, progress: Progress, sweep: bool,
               finished_at: Callable[[], int | None]) -> None:
    """Record the failure where ``run_dir`` is this launch's; a single run stops with its one message, a sweep
    goes on to its next point (one held by another launch, or finished, is skipped: no failure)."""
    skipped = None if not sweep or progress.took_over_run_dir else held_elsewhere(run_dir, err, finished_at)
    if skipped is not None:
        drop_held_job_log()
        log.warning("skipped %s: %s", run_dir, skipped)
        point_ended(run_dir, skipped=skipped)
        return
    rerun = record_failure(run_dir, err, reason, progress)
    if not sweep:
        stop_with_message(f"error: {reason}", every_rank_meets_it=isinstance(err, ERRORS_EVERY_RANK_MEETS),
                          restartable=not isinstance(err, ERRORS_A_RESTART_CANNOT_FIX))
    log.error("error: %s", reason)
    point_ended(run_dir, reason, rerun=rerun)


def held_elsewhere(run_dir: Path, err: Exception, finished_at: Callable[[], int | None]) -> str | None:
    """Why a sweep point is not this launch's to train, where it is not: another live launch holds it, or it
    finished already (the same sweep launched twice into one directory, or its resume.sh run beside it)."""
    if isinstance(err, RunDirectoryInUse):
        return f"another launch is training it ({err.holder or 'a live process'})"
    if isinstance(err, RunDirectoryTaken):
        with contextlib.suppress(ValueError, OSError):  # its checkpoints unreadable: a failure to tell
            step = finished_at()
            if step is not None:
                return f"it finished already, at step {step}"
    return None


def failure_kind(err: BaseException) -> str:
    if isinstance(err, FaultOfEveryRank):
        err = err.__cause__
    if isinstance(err, TrainingDiverged):
        return "diverged"
    if isinstance(err, (ValueError, FileNotFoundError)):  # the config, the data or the directory refused
        return "refused"
    return "error"


def record_failure(run_dir: Path, err: BaseException, reason: str, progress: Progress) -> Path | None:
    """Write ``failure.json`` into ``run_dir`` (rank 0), and the job log's lines held back until now, where the
    directory is this launch's: it took the directory over, or the directory holds no run's records and no other
    live launch. Another run's directory (a launch refused for it, or a resume of it refused) is left as it was:
    the reason is printed only. A sweep point also gets its ``rerun.sh``, which is returned."""
    if int(os.environ.get("RANK", "0")) != 0:
        (write_held_job_log if progress.took_over_run_dir else drop_held_job_log)()
        return None
    step = progress.step
    if isinstance(err, TrainingDiverged):  # how it diverged, at the step it did: the advice is no table's cell
        reason, step = err.reason, err.step
    lock = RunDirectoryLock(run_dir)
    try:
        lock.acquire()
    except (RunDirectoryError, OSError) as problem:
        drop_held_job_log()
        if not isinstance(problem, RunDirectoryInUse):
            warn_failure_not_recorded(run_dir, problem)
        return None
    try:
        if not progress.took_over_run_dir and previous_run_files(run_dir):
            drop_held_job_log()
            return None
        write_held_job_log()
        record = {"kind": failure_kind(err), "reason": reason, "step": step,
                  "overrides": list(HydraConfig.get().overrides.task),
                  "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        with atomic_file(Path(run_dir) / FAILURE_FILE) as f:
            json.dump(record, f, indent=1)
        return write_rerun_script(run_dir) if in_sweep() else None
    except OSError as problem:
        warn_failure_not_recorded(run_dir, problem)
    finally:
        lock.release()
    return None


def warn_failure_not_recorded(run_dir: Path, problem: Exception) -> None:
    # A full disk refuses the job log there too (its handler then raises): the run's own error says enough.
    with contextlib.suppress(LogFileWriteError):
        log.warning("the failure is not recorded in %s: %s", run_dir, problem)


def clear_failure(run_dir: Path) -> None:
    """A launch that trains in ``run_dir`` (a resume, an overwrite, a rerun) replaces the record of an earlier
    failure, and the script that reran it."""
    for name in (FAILURE_FILE, RERUN_SCRIPT):
        (Path(run_dir) / name).unlink(missing_ok=True)


class SweepOutcomes(Callback):
    """Hydra callback (configs/config.yaml), in the process that launches a sweep: writes the sweep's
    ``resume.sh`` and names this launch, under which its points record how they ended, which ``sweep_report``
    reads once they have run."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        global _launched_sweep_dir
        _launched_sweep_dir = Path(config.hydra.sweep.dir)
        # Inherited by the points, whether they run in this process or as jobs of their own.
        os.environ[SWEEP_LAUNCH_VARIABLE] = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        write_resume_script(_launched_sweep_dir)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """A point that a signal stopped (at its checkpoint) in the process that launched the sweep ends the sweep
        here, before Hydra announces the next point or makes its directory. (SystemExit, not an Exception:
        Hydra turns an Exception from a callback into a warning.)"""
        signal_name = received_signal()
        if _launched_sweep_dir is not None and signal_name is not None:
            stop_sweep(f"the sweep stopped on {signal_name} during {config.hydra.runtime.output_dir} (its checkpoint "
                       f"holds its state); no further point starts. Finish every point (finished ones are skipped) "
                       f"with: {resume_command()}")


def stop_sweep(reason: str) -> NoReturn:
    """End the sweep's process with the failed points so far, then ``reason``, as its last line."""
    raise SystemExit("\n".join([*sweep_report(), f"error: {reason}"])) from None


def launch_outcomes(sweep_dir: Path) -> Path:
    """Where the points of this launch of the sweep in ``sweep_dir`` record how they ended."""
    return Path(sweep_dir) / OUTCOMES_DIR / os.environ.get(SWEEP_LAUNCH_VARIABLE, "")


def point_ended(run_dir: Path, reason: str | None = None, skipped: str | None = None,
                rerun: Path | None = None) -> None:
    """Record in the sweep directory how this point ended (``reason``: why it failed, ``rerun``: its rerun.sh;
    ``skipped``: why this launch left it to another; neither: it ran)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return
    hydra_cfg = HydraConfig.get()
    outcome = launch_outcomes(hydra_cfg.sweep.dir) / f"{hydra_cfg.job.num}.json"
    try:
        outcome.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(outcome) as f:
            json.dump({"run_dir": str(run_dir), "reason": reason, "skipped": skipped,
                       "rerun": rerun and shlex.join(["bash", str(rerun)])}, f)
    except OSError as problem:
        log.warning("how %s ended is left out of the sweep's report: %s", run_dir, problem)


def sweep_report() -> list[str]:
    """In the process that launched a sweep: one line per failed point and a last line counting them (and the
    points this launch skipped, held by another launch or finished); empty when none failed (or no sweep was
    launched)."""
    if _launched_sweep_dir is None:
        return []
    outcomes, folder = [], launch_outcomes(_launched_sweep_dir)
    for path in sorted(folder.glob("*.json"), key=lambda path: int(path.stem)):
        try:
            outcomes.append(json.loads(path.read_text()))
        except (OSError, ValueError) as problem:
            log.warning("%s is unreadable, left out of the sweep's report: %s", path, problem)
    shutil.rmtree(folder, ignore_errors=True)
    failed = [outcome for outcome in outcomes if outcome["reason"] is not None]
    if not failed:
        return []
    skipped = sum(outcome.get("skipped") is not None for outcome in outcomes)
    others = f"the others ran, but {skipped} that another launch held or had finished" if skipped else "the others ran"
    return [*(f"failed: {outcome['run_dir']}: {outcome['reason']}"
              + (f" | rerun it alone: {outcome['rerun']}" if outcome.get("rerun") else "") for outcome in failed),
            f"{len(failed)} of {len(outcomes)} sweep points failed (each one's {FAILURE_FILE} says why); {others}"]
