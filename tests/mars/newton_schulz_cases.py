"""Every optimizer of mars that runs Newton-Schulz, with the variants that change how (the exact scheme, float32
updates) and the forms each takes, read from their constructors: a new one is tested without a line here."""
import inspect

import torch

from mars import newton_schulz
from tests.mars.test_torch_conventions import optimizers_of_mars


def newton_schulz_optimizers() -> dict[str, tuple[type, dict]]:
    """Name -> (class, constructor arguments): each class with an ``ns_form`` (MARS as mars-shampoo), in the exact
    scheme too where it has one, with float32 updates where it rounds them otherwise."""
    cases = {}
    for cls in optimizers_of_mars():
        arguments = inspect.signature(cls).parameters
        if "ns_form" not in arguments:
            continue
        base = dict(mars_type="mars-shampoo", backend="torch") if "mars_type" in arguments else {}
        cases[cls.__name__] = (cls, base)
        if "is_approx" in arguments:
            cases[f"{cls.__name__}-exact"] = (cls, {**base, "is_approx": False})
        if "update_dtype" in arguments:
            cases[f"{cls.__name__}-float32-updates"] = (cls, {**base, "update_dtype": torch.float32})
    return cases


def forms(optimizer_class: type, arguments: dict) -> tuple[str, ...]:
    """The Newton-Schulz forms it takes with ``arguments`` (gram needs the norm in the Newton-Schulz dtype)."""
    def takes(form):
        try:
            optimizer_class([torch.nn.Parameter(torch.zeros(2, 2))], **arguments, ns_form=form)
        except ValueError:
            return False
        return True

    return tuple(form for form in newton_schulz.NS_FORMS if takes(form))
