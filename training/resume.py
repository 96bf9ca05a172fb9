"""What a resume may change: settings that keep the checkpoint's state meaningful take effect (and are logged);
changes that would make it meaningless stop the run before anything is loaded."""
import logging

import torch

from training.registry import OPTIMIZERS

log = logging.getLogger("train")

# Keys whose change leaves the checkpoint's weights or optimizer state without meaning, and why.
STATE_DEFINING_KEYS = {
    "model.n_layer": "the model's shape",
    "model.n_head": "the model's shape",
    "model.n_embd": "the model's shape",
    "model.block_size": "the model's shape (position embeddings)",
    "model.vocab_size": "the vocabulary (embedding and head rows)",
    "model.bias": "the model's parameters",
    "model.activation": "what the trained weights compute",
    "model.scale_attn_by_inverse_layer_idx": "what the trained weights compute",
    "optimizer.name": "the optimizer and its state",
    "optimizer.decay_embeddings": "the optimizer's parameter groups",
    **{f"optimizer.{key}": why for entry in OPTIMIZERS.values() for key, why in entry.state_keys.items()},
}
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


def check_resumable(changes: dict[str, tuple], checkpoint_path) -> None:
    """Raise :class:`ResumeRefused` naming every state-defining key among ``changes``."""
    refused = [f"{key} (checkpoint {old!r}, now {new!r}: {STATE_DEFINING_KEYS[key]})"
               for key, (old, new) in changes.items() if key in STATE_DEFINING_KEYS]
    if refused:
        raise ResumeRefused(
            f"cannot resume {checkpoint_path} with a changed {'; '.join(refused)}; the checkpoint's state does not "
            "fit. Resume with the checkpoint's value, or start a new run in another hydra.run.dir"
        )


def configured_hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Every param group's settings but its parameters, as the config built them (call before loading a state)."""
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def restore_hyperparameters(optimizer: torch.optim.Optimizer, configured: list[dict]) -> None:
    """Put the configured settings back after ``load_state_dict``, which brings the checkpoint's groups back.

    Whatever the checkpoint's groups carried beside them (such as the schedule's ``peak_lr``) goes, so the
    configured lr, betas, weight decay, gamma, ... take effect from the first resumed step.
    """
    for group, settings in zip(optimizer.param_groups, configured, strict=True):
        params = group["params"]
        group.clear()
        group.update(settings, params=params)
