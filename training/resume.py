"""Resuming a run: the newest checkpoint every rank can read, and what a resume may change. Settings that keep the
checkpoint's state meaningful take effect (and are logged); changes that would make it meaningless stop the run
before anything is loaded."""
import logging
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from configs.registry import OPTIMIZERS
from configs.schema import LrSchedule, lr_decay_end
from data.authors_draws import AuthorsDraws
from mars.optimizer import ratio_key
from mars.traits import constructor_arguments, trait
from training.checkpoint import CheckpointReadError, latest_checkpoint, set_aside_checkpoints_after
from training.distributed import DistributedContext, all_gather_objects
from training.optimizers import local_optimizer
from training.runtime import set_rng_state
from training.summary import Progress
from training.run_dir import RunDirectoryError
from training.sweep import in_sweep

log = logging.getLogger("train")

# Keys whose change leaves the checkpoint's weights or optimizer state without meaning whatever the optimizer, and why.
COMMON_STATE_KEYS = {
    "model.n_layer": "the model's shape",
    "model.n_head": "the model's shape",
    "model.n_embd": "the model's shape",
    "model.block_size": "the model's shape (position embeddings)",
    "model.vocab_size": "the vocabulary (embedding and head rows)",
    "model.bias": "the model's parameters",
    "model.activation": "what the trained weights compute",
    "model.scale_attn_by_inverse_layer_idx": "what the trained weights compute",
    "model.arch": "the model and its parameters",
    "model.intermediate_size": "the model's shape",
    "model.tie_embeddings": "the model's parameters",
    "model.rms_norm_eps": "what the trained weights compute",
    "model.rope_theta": "what the trained weights compute",
    "optimizer.name": "the optimizer and its state",
    "optimizer.decay_embeddings": "the optimizer's parameter groups",
}


def state_defining_keys(optimizer_name: str) -> dict[str, str]:
    """The keys whose change on resume leaves the checkpoint's state without meaning, and why: the common ones and
    those of the optimizer's own row (``state_keys``), which bind no other optimizer."""
    entry = OPTIMIZERS.get(optimizer_name)
    own = entry.state_keys if entry else {}
    return {**COMMON_STATE_KEYS, **{f"optimizer.{key}": why for key, why in own.items()}}


# Keys that only say how this launch resumes: not a change of the run's settings.
LAUNCH_KEYS = {"train.resume", "train.overwrite", "train.distributed_timeout_s"}


class ResumeRefused(ValueError):
    """The configured run cannot continue from the checkpoint; the message names each key and its values."""


def flat_items(tree: dict, prefix: str = "") -> dict[str, object]:
    """A nested config as {"optimizer.gamma": 0.05, ...}."""
    items = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            items.update(flat_items(value, f"{prefix}{key}."))
        else:
            items[f"{prefix}{key}"] = value
    return items


def config_changes(saved: dict, configured: dict) -> dict[str, tuple]:
    """{key: (checkpoint's value, configured value)} for each key both configs record with different values.

    A key only one of them has (a checkpoint older than the key) is not reported: its old value is unknown.
    """
    old, new = flat_items(saved), flat_items(configured)
    return {key: (old[key], new[key]) for key in sorted(old.keys() & new.keys())
            if key not in LAUNCH_KEYS and old[key] != new[key]}


def check_resumable(changes: dict[str, tuple], checkpoint_path, optimizer_name: str) -> None:
    """Raise :class:`ResumeRefused` naming every key among ``changes`` that defines the state of a run of the
    optimizer ``optimizer_name``."""
    defining = state_defining_keys(optimizer_name)
    refused = [f"{key} (checkpoint {old!r}, now {new!r}: {defining[key]})"
               for key, (old, new) in changes.items() if key in defining]
    if refused:
        raise ResumeRefused(
            f"cannot resume {checkpoint_path} with a changed {'; '.join(refused)}; the checkpoint's state does not "
            "fit. Resume with the checkpoint's value, or start a new run in another hydra.run.dir"
        )


def configured_keys(optimizer_class: type[torch.optim.Optimizer]) -> set[str]:
    """The param-group keys a config sets: the constructor's arguments (a second learning rate as its ratio to lr,
    mars.optimizer.ratio_key), but those the class keeps as its state (``GROUP_STATE_KEYS``, mars/traits.py)."""
    arguments = constructor_arguments(optimizer_class) | {
        ratio_key(name) for name in getattr(optimizer_class, "FOLLOWING_LRS", ())}
    return arguments - set(trait(optimizer_class, "GROUP_STATE_KEYS"))


def fresh_param_groups(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Every param group's keys but its parameters, as built from the config (call before loading a state)."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def restore_hyperparameters(optimizer: torch.optim.Optimizer, fresh: list[dict]) -> None:
    """Put the configured settings back after ``load_state_dict``, which brings the checkpoint's groups back.

    The settings the config sets (the optimizer's constructor arguments: lr, betas, weight decay, gamma, ...) take
    their configured value from the first resumed step. What the optimizer keeps in its groups beside them (a step
    counter, a schedule-free average's weight) is its state and keeps the checkpoint's value. What only the
    checkpoint's groups carry (the schedule's ``peak_lr``) goes.
    """
    configured = configured_keys(type(local_optimizer(optimizer)))
    for group, built in zip(optimizer.param_groups, fresh, strict=True):
        kept = {key: group[key] for key in built if key not in configured and key in group}
        params = group["params"]
        group.clear()
        group.update(built, **kept, params=params)


def schedule_changes(saved_train: dict, t) -> list[str]:
    """What a resume changes in the lr schedule's shape: a longer ``max_iters`` stretches the decay (a constant
    schedule, the run's and the checkpoint's, has none to stretch)."""
    saved_end, end = lr_decay_end(saved_train), lr_decay_end(t)
    if saved_end == end or LrSchedule(t.lr_schedule) == LrSchedule(saved_train["lr_schedule"]) == LrSchedule.constant:
        return []
    return [f"the lr schedule now reaches train.min_lr at step {end} instead of the checkpoint's {saved_end} "
            f"(train.max_iters {saved_train['max_iters']} -> {t.max_iters}, train.decay_iters "
            f"{saved_train.get('decay_iters')} -> {t.decay_iters}): from here on the lr differs from the original "
            "run's plan"]


def resume_from(ckpt: dict, checkpoint_path: Path, config_dict: dict, model, optimizer, ctx: DistributedContext,
                draws: AuthorsDraws | None = None) -> dict[str, tuple]:
    """Load the checkpoint's weights, optimizer state and random streams (the authors' draws among them); the
    configured hyperparameters then replace the checkpoint's. Returns the settings that differ from the
    checkpoint's (each one logged).

    Raises :class:`ResumeRefused` when a change leaves the state without meaning.
    """
    changes = config_changes(ckpt["config"], config_dict)
    check_resumable(changes, checkpoint_path, config_dict["optimizer"]["name"])
    if draws:
        draws.load_state_dict(authors_draws_of_this_rank(ckpt, checkpoint_path, ctx))
    fresh = fresh_param_groups(optimizer)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    restore_hyperparameters(optimizer, fresh)
    rng_states = ckpt["rng"]
    if len(rng_states) == ctx.world_size:
        set_rng_state(rng_states[ctx.rank])
    else:
        log.warning("the checkpoint was written by %d processes, this run has %d: the random streams "
                    "(dropout) restart from train.seed", len(rng_states), ctx.world_size)
    log.info("resumed from %s at step %d", checkpoint_path, ckpt["step"])
    log_changes(changes, ckpt["step"])
    return changes


def log_changes(changes: dict[str, tuple], step: int) -> None:
    for key, (old, new) in changes.items():
        log.info("changed on resume: %s %r -> %r (from step %d on)", key, old, new, step)


def process_changes(ckpt: dict, train: dict, world_size: int) -> dict[str, tuple]:
    """A resume by another number of processes (the checkpoint holds one random state per rank), and the global
    batch (in sequences) it changes where ``train.global_batch_size`` does not hold it: ``train.grad_accum_steps``
    counts micro-batches per process."""
    saved_world_size = len(ckpt["rng"])
    if saved_world_size == world_size:
        return {}
    saved = ckpt["config"]["train"]
    saved_batch = saved["batch_size"] * saved["grad_accum_steps"] * saved_world_size
    batch = train["batch_size"] * train["grad_accum_steps"] * world_size
    changes = {"processes": (saved_world_size, world_size)}
    if batch != saved_batch:
        changes["train.global_batch_size"] = (saved_batch, batch)
    return changes


def data_changes(saved: dict | None, read: dict) -> dict[str, tuple]:
    """The data this launch reads where it is not what the checkpoint's launches read, whatever the config says
    (a symlinked data.dir re-pointed, a corpus prepared again); a checkpoint from before this record: unknown."""
    if saved is None or saved == read:
        return {}
    return {"data": (data_in_words(saved), data_in_words(read))}


def data_in_words(read: dict) -> str:
    """``train 240,000 tokens in 12 shard(s), val 12,000 tokens in 1 shard(s) (fingerprint 3fa1..., ...)``."""
    sizes = ", ".join(f"{split} {r['tokens']:,} tokens in {r['shards']} shard(s)" for split, r in read.items())
    return f"{sizes} (fingerprint {', '.join(str(r.get('fingerprint')) for r in read.values())})"


def authors_draws_of_this_rank(ckpt: dict, checkpoint_path: Path, ctx: DistributedContext) -> dict:
    """The state of this rank's authors' draws in the checkpoint; refused when it has none for this many ranks."""
    states = ckpt.get("authors_draws")
    if states is None:
        raise ResumeRefused(f"cannot resume {checkpoint_path} with data.draws=authors: it was written under "
                            "data.draws=keyed, so the authors' draws have no state to continue from. Resume with "
                            "data.draws=keyed, or start a new run in another hydra.run.dir")
    if len(states) != ctx.world_size:
        raise ResumeRefused(f"cannot resume {checkpoint_path} on {ctx.world_size} process(es) with "
                            f"data.draws=authors: each of its {len(states)} ranks drew its own windows. Resume on "
                            f"{len(states)} processes, or with data.draws=keyed")
    return states[ctx.rank]


def find_resume_checkpoint(run_dir: Path, device: torch.device, ctx: DistributedContext) -> tuple[Path, dict] | None:
    """The newest loadable checkpoint, the same one on every rank, or None; every rank stops alike otherwise.

    A rank that could not read the newest checkpoint (a lagging network file system) would train on from another
    step than the rest; a rank that could read none would stop while the others waited for it.
    """
    found, problem = None, None
    try:
        found = latest_checkpoint(run_dir, device)
    except Exception as err:  # whatever stops this rank (also running out of memory) must stop the others too
        problem = err
    outcomes = all_gather_objects(("error", f"{problem}") if problem else ("found", found and found[0].name), ctx)
    if problem is not None:
        raise problem
    failed = [(rank, message) for rank, (kind, message) in enumerate(outcomes) if kind == "error"]
    if failed:
        rank, message = failed[0]
        raise CheckpointReadError(f"rank {rank} cannot resume: {message}")
    if len({name for _, name in outcomes}) > 1:
        listed = ", ".join(f"rank {rank}: {name or 'none'}" for rank, (_, name) in enumerate(outcomes))
        raise ValueError(f"the ranks found different newest checkpoints in {run_dir} ({listed}): every rank must "
                         "see the same run directory, on a file system they share; check it and resume again")
    return found


@dataclass
class Resumed:
    """What a launch takes over from the checkpoint it resumed from, beside the weights, the optimizer state and
    the ``Progress`` (a fresh start takes over nothing)."""

    changes: dict[str, tuple] = field(default_factory=dict)  # {key: (checkpoint's value, configured value)}
    wandb_run_id: str | None = None
    skipped_steps: int = 0


def resume_run(run_dir: Path, t, config_dict: dict, data_read: dict, model, optimizer, draws: AuthorsDraws | None,
               ctx: DistributedContext, progress: Progress) -> Resumed:
    """Continue from the newest checkpoint in ``run_dir``: load it into ``model``, ``optimizer`` and ``draws``
    (``data.draws=authors``) and move ``progress`` to its step. Without one, the run starts from scratch. A
    checkpoint at ``train.max_iters`` or past it leaves nothing to train: said here, and the caller stops. Beside
    the config's changes, a resume by another number of processes, or on other data (``data_read``: what this
    launch reads), is told and returned as changes."""
    found = find_resume_checkpoint(run_dir, ctx.device, ctx)
    if found is None:
        refuse_a_point_kept_under_another_name(run_dir, config_dict)
        if in_sweep():  # a resumed sweep starts the points it had not reached: nothing amiss
            log.info("starting %s from step 0: no checkpoint of this point yet", run_dir)
        else:
            log.warning("train.resume=true but %s has no checkpoint yet: starting from scratch", run_dir)
        return Resumed()
    checkpoint_path, ckpt = found
    changes = resume_from(ckpt, checkpoint_path, config_dict, model, optimizer, ctx, draws)
    launch = {**process_changes(ckpt, config_dict["train"], ctx.world_size),
              **data_changes(ckpt.get("data"), data_read)}
    launch = {key: values for key, values in launch.items() if key not in changes}  # the config's say it already
    log_changes(launch, ckpt["step"])
    changes.update(launch)
    if ctx.is_main:
        set_aside_checkpoints_after(run_dir, ckpt["step"])
    progress.step, progress.tokens, progress.checkpoint = ckpt["step"], ckpt["tokens"], checkpoint_path
    for message in schedule_changes(ckpt["config"]["train"], t):
        log.warning(message)
    if progress.step >= t.max_iters:
        log.info("already at train.max_iters=%d: nothing to do (raise train.max_iters to train on)", t.max_iters)
        if changes:
            log.warning("the changed settings above were not applied: nothing was trained, and the run's "
                        "record (.hydra/, metrics.jsonl) is left as the run wrote it")
    return Resumed(changes, ckpt.get("wandb_run_id"), ckpt.get("skipped_steps", 0))


def refuse_a_point_kept_under_another_name(run_dir: Path, config_dict: dict) -> None:
    """A resumed sweep point whose directory holds no checkpoint, while the sweep holds the same point (its
    number, and the settings but for those a point's name leaves out) under the name an earlier launch gave it
    (a version that named points otherwise): stop, rather than train it again from step 0 beside its record."""
    if not in_sweep():
        return
    hydra_cfg = HydraConfig.get()
    left_out_of_names = set(hydra_cfg.job.config.override_dirname.exclude_keys)
    for other in sorted(Path(hydra_cfg.sweep.dir).glob(f"{hydra_cfg.job.num}_*")):
        recorded = other / ".hydra" / "config.yaml"
        if other.resolve() == Path(run_dir).resolve() or not (other / "metrics.jsonl").is_file():
            continue
        try:
            saved = OmegaConf.to_container(OmegaConf.load(recorded), resolve=True)
        except Exception:  # no readable record: not a point this check can recognise
            continue
        if all(key in left_out_of_names for key in config_changes(saved, config_dict)):
            raise RunDirectoryError(
                f"{other} holds this sweep point (its number and settings) under the name an earlier launch gave "
                f"it, and this launch names it {Path(run_dir).name}: resumed here it would train again from step "
                f"0. Move the point into place (rm -r {shlex.quote(str(run_dir))} && mv {shlex.quote(str(other))} "
                f"{shlex.quote(str(run_dir))}), then resume the sweep again")
