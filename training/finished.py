"""A run that reached train.max_iters: which checkpoints it keeps (train.finished_checkpoints), and a resume of it
that has nothing to do, found from the run's files before a checkpoint is loaded or the model built (a sweep
resumed in place has many such points)."""
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from training.checkpoint import (CorruptCheckpoint, checkpoint_files, checkpoint_step, finished_without_checkpoints,
                                 keep_when_finished, verify_checkpoint)
from training.distributed import DistributedContext, all_gather_objects
from training.resume import config_changes

log = logging.getLogger("train")


def finished_step(run_dir: Path, max_iters: int) -> int | None:
    """The step the run in ``run_dir`` finished at, when at or past ``max_iters``: its newest checkpoint's (by its
    name, once its bytes check out: a torn one is the resume's to set aside), or the step that
    train.finished_checkpoints=none recorded when it deleted them. None when there is training left."""
    files = checkpoint_files(run_dir)
    if files:
        if checkpoint_step(files[-1]) < max_iters:
            return None
        try:
            verify_checkpoint(files[-1])
        except (CorruptCheckpoint, OSError):  # the resume falls back over it, or says why it cannot read it
            return None
        return checkpoint_step(files[-1])
    deleted_at = finished_without_checkpoints(run_dir)
    if deleted_at is not None and deleted_at < max_iters:
        raise ValueError(f"{run_dir} finished at step {deleted_at} and its checkpoints were deleted then "
                         f"(train.finished_checkpoints=none): it cannot train on to train.max_iters={max_iters}. "
                         "Start it over with train.overwrite=true instead of train.resume=true")
    return deleted_at


def nothing_left_to_train(run_dir: Path, cfg: DictConfig, ctx: DistributedContext) -> bool:
    """Whether a resume of ``run_dir`` finds the run finished (every rank alike); then it says so, and which
    configured changes it did not apply, and nothing of the run is loaded or rewritten (its train.log neither:
    these lines go to the console only). A run past ``train.max_iters`` is refused, naming its step."""
    step = finished_step(run_dir, cfg.train.max_iters)
    if len(set(all_gather_objects(step, ctx))) > 1:
        raise ValueError(f"the ranks see different checkpoints in {run_dir}: every rank must see the same run "
                         "directory, on a file system they share; check it and resume again")
    if step is None:
        return False
    if step > cfg.train.max_iters:  # a job chain must not read success: the run is not where it was asked to be
        raise ValueError(f"{run_dir} is at step {step}, past train.max_iters={cfg.train.max_iters}: a resume cannot "
                         f"train back to an earlier step. Resume with train.max_iters={step} or more, or start over "
                         "in it with train.overwrite=true")
    deleted = not checkpoint_files(run_dir)
    log.info("already at train.max_iters=%d: nothing to do (%s)", cfg.train.max_iters,
             f"the run finished at step {step}; its checkpoints were deleted then, train.finished_checkpoints=none"
             if deleted else "raise train.max_iters to train on")
    recorded = Path(run_dir) / ".hydra" / "config.yaml"
    if ctx.is_main and recorded.is_file():
        changes = config_changes(OmegaConf.to_container(OmegaConf.load(recorded), resolve=True),
                                 OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
        if changes:
            log.warning("the changed settings (%s) were not applied: nothing was trained, and the run's record "
                        "(.hydra/, metrics.jsonl) is left as the run wrote it",
                        ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items()))
    return True


def keep_finished_checkpoints(run_dir: Path, step: int, t: DictConfig, checkpoint_path: Path | None) -> Path | None:
    """Once the run reached ``t.max_iters``, keep only the checkpoints that train.finished_checkpoints asks for;
    returns ``checkpoint_path``, or None where it was deleted."""
    if step < t.max_iters or not keep_when_finished(run_dir, step, t.finished_checkpoints.value):
        return checkpoint_path
    log.info("finished: checkpoints deleted as train.finished_checkpoints=%s asks", t.finished_checkpoints.value)
    return checkpoint_path if checkpoint_path is not None and checkpoint_path.exists() else None
