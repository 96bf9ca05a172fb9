"""MARS (arXiv 2411.10438) and the Muon baseline as ``torch.optim`` optimizers; needs only torch.

Every optimizer class that a module of ``mars`` defines imports from ``mars``: those below by name, any other (a new
rule in ``mars/<name>.py``) when first asked for (``from mars import ADOPT``).
"""
import importlib
import pkgutil

import torch

from mars.mars_m import MarsM, MarsMEfficient, Moonlight
from mars.muon import Muon
from mars.optimizer import MARS, available_backends

__all__ = ["MARS", "MarsM", "MarsMEfficient", "Moonlight", "Muon", "available_backends"]


def __getattr__(name: str) -> type[torch.optim.Optimizer]:
    # PEP 562: called for a name this module does not define. Its modules are imported in turn until one defines
    # an optimizer class of that name, without importing the others (the Triton backend) before they are needed.
    # A module that cannot be imported here (the Triton backend without Triton) defines nothing to find: the name
    # is missing (AttributeError, so that hasattr and ``from mars import <submodule>`` work), and the message says
    # which modules were not searched.
    unimportable = []
    for module in pkgutil.iter_modules(__path__):
        try:
            found = getattr(importlib.import_module(f"{__name__}.{module.name}"), name, None)
        except ImportError as error:
            unimportable.append(f"{__name__}.{module.name} ({error})")
            continue
        if isinstance(found, type) and issubclass(found, torch.optim.Optimizer) and not name.startswith("_"):
            return found
    not_searched = f"; not searched, as they cannot be imported here: {', '.join(unimportable)}" if unimportable else ""
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}{not_searched}")
