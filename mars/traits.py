"""What the harness reads of an optimizer class beyond torch.optim's interface: each trait a class attribute, with
the default that any class without it (torch.optim's, an installed package's) takes.

The shared tests (tests/mars/test_torch_conventions.py, tests/training/), the resume (training/resume.py) and the
trainer read them through :func:`trait`, per optimizer; the traits of a configuration rather than of a class (the
config keys that define its state, the train settings it needs or refuses, the lr it reports) are its row's in
``configs/registry.py``. docs/optimizers.md, "Adding an optimizer", lists both.
"""
import inspect

import torch

DEFAULTS = {
    # Steps that only initialise state and leave the parameters where they are (ADOPT's first step sets its second
    # moment): what a test expecting a step to move the weights reads.
    "STATE_ONLY_STEPS": 0,
    # Whether every update is the lr times a direction the lr does not change: then torch's schedulers scale the
    # updates in proportion and lr 0 freezes a group. Schedule-free AdamW's average moves at lr 0 by design.
    "UPDATES_LINEAR_IN_LR": True,
    # The keys beside its constructor's arguments that it keeps in each param group as its state (schedule-free
    # AdamW's k, weight_sum, lr_max): a resume keeps the checkpoint's, and a fresh optimizer's differ from them.
    "GROUP_STATE_KEYS": (),
}


def trait(optimizer: type[torch.optim.Optimizer] | torch.optim.Optimizer, name: str):
    """The class's (or an instance's class's) ``name`` trait, or its default."""
    cls = optimizer if isinstance(optimizer, type) else type(optimizer)
    return getattr(cls, name, DEFAULTS[name])


def constructor_arguments(optimizer_class: type[torch.optim.Optimizer]) -> set[str]:
    """The names of the arguments ``optimizer_class`` (and the classes it extends) takes but its parameters: the
    settings a config sets, which a param group may also set."""
    return {name for cls in optimizer_class.__mro__ if issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer for name in inspect.signature(cls.__init__).parameters} - {
        "self", "params"}
